"""The shared table helper (`cli/render.py`): tables never cut a word, a number or a setting name."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from alloctune.cli.render import Col, FitTable, kv_table, min_width, wrap_spans

SETTING = "expandable_segments:True,max_split_size_mb:128,garbage_collection_threshold:0.6"


def _render(renderable, width: int) -> list[str]:
    c = Console(width=width, record=True, color_system=None, file=open("/dev/null", "w"))
    c.print(renderable)
    return c.export_text(styles=False).splitlines()


def _tokens(lines: list[str]) -> set[str]:
    return {t for line in lines for t in line.split()}


def test_wrap_breaks_at_spaces_then_after_separators():
    text = "peak 1.08 GiB " + SETTING
    lines = [text[a:b] for a, b in wrap_spans(text, 32)]
    assert all(len(x) <= 32 for x in lines)
    assert lines[0] == "peak 1.08 GiB"
    # the setting is folded after its commas, each knob whole
    assert lines[1:] == ["expandable_segments:True,", "max_split_size_mb:128,", "garbage_collection_threshold:0.6"]


def test_min_width_keeps_numbers_and_names_whole():
    assert min_width("1.08 GiB") == 4
    assert min_width("1.08 GiB", nowrap=True) == 8
    assert min_width(SETTING) == len("garbage_collection_threshold:0.6")
    assert min_width(SETTING, hard=True) == len("garbage_collection_threshold:")
    assert min_width("torch.cuda.set_per_process_memory_fraction", hard=True) == len("set_per_process_memory_fraction")
    assert min_width("1e+10 3.14159", hard=True) == 7


def _table() -> FitTable:
    t = FitTable(Col("setting"), Col("peak\nreserved", justify="right", nowrap=True), Col("note"), title="demo")
    t.add_row(SETTING, "12.34 GiB", "blocks this large or larger are never split and small requests never use them")
    t.add_row("", "0 bytes", "default")
    return t


@pytest.mark.parametrize("width", [120, 80, 60, 40, 34])
def test_table_fits_and_cuts_nothing(width):
    lines = _render(_table(), width)
    assert all(len(line.rstrip()) <= width for line in lines), lines
    assert "…" not in "\n".join(lines)
    tokens = _tokens(lines)
    words = "blocks this large or larger are never split and small requests never use them".split()
    assert set(words) <= tokens
    assert "12.34" in tokens and "GiB" in tokens
    # the setting is folded only after its commas: every knob:value stays whole
    for piece in SETTING.split(","):
        assert any(piece in t for t in tokens), piece


def test_wide_table_is_a_table_narrow_one_is_stacked():
    wide = _render(_table(), 120)
    assert any(line.startswith("─") for line in wide)  # the header rule of a real table
    narrow = _render(_table(), 40)  # 32 + 2 gaps + 9 + the note's longest word > 40
    assert any(line.startswith("setting:") for line in narrow)
    assert any("12.34 GiB" in line for line in narrow)  # a nowrap cell stays on one line


def test_nowrap_column_is_never_wrapped_in_table_layout():
    lines = _render(_table(), 80)
    assert any(re.search(r"12\.34 GiB", line) for line in lines)


def test_kv_table_has_no_header():
    lines = _render(kv_table([("requests", "42 (alloc 21, free 21)")], title="t"), 80)
    assert lines[0].startswith("t") and any(line.startswith("requests") for line in lines)


def test_row_length_is_checked():
    with pytest.raises(ValueError):
        FitTable("a", "b").add_row("x")
