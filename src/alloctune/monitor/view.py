"""The `watch` view of one sample: a line per GPU, then its processes (a rich table, imported lazily)."""

from __future__ import annotations

import time
from typing import Callable

from alloctune.monitor.log import _blank
from alloctune.monitor.sample import Sample
from alloctune.units import format_percent


def short_size(n: int) -> str:
    """Compact sizes for the live view (`6.0G`, `300M`): the terminal is narrow, logs keep bytes."""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f}G"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.0f}M"
    return f"{n / 1024:.0f}K"


def sample_table(sample: Sample, fmt: Callable[[int], str] = short_size, width: int = 120):
    """The watch view of one sample: a line per GPU, then its processes (rich Table).

    Allocator columns are filled only for processes that publish live stats (`alloctune run`);
    NVML's "used" includes the CUDA context and non-PyTorch memory, so it exceeds "resv".
    "a/r" is the project's utilization (peak allocated / peak reserved), "split" the
    inactive-split bytes, "cap" the budget `alloctune run` applied. Only the first column
    gives way on a narrow terminal (`width`).
    """
    from rich import box
    from rich.table import Table

    f = fmt
    table = Table(
        title=time.strftime("alloctune watch  %H:%M:%S", time.localtime(sample.time)),
        expand=False,
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
        collapse_padding=True,
        show_edge=False,
    )
    first = max(10, min(48, width - 74))
    table.add_column("GPU / process", overflow="ellipsis", no_wrap=True, width=first)
    for name, w in (("used", 9), ("total", 6), ("cap", 6), ("resv", 6), ("alloc", 6), ("split", 6), ("a/r", 6), ("retry/OOM", 9)):
        table.add_column(name, justify="right", no_wrap=True, min_width=w)
    for g in sample.gpus:
        pct = f" {g.used / g.total:.0%}" if g.total else ""
        util = "" if g.util is None else f" {g.util}%"
        table.add_row(f"[bold]{g.index} {g.name}[/bold]{util}", f"{f(g.used)}{pct}", f(g.total), "", "", "", "", "", "")
        for p in g.processes:
            a = p.allocator
            used = "?" if p.used is None else f(p.used)
            if a is None:
                table.add_row(f"  {p.pid}", used, "", "", "", "", "", "", "")
                continue
            util = a.utilization
            who = f"  {p.pid}" + ("" if a.rank is None else f" r{a.rank}") + f" {a.cmd}"
            retries = "" if a.retries is None and a.ooms is None else f"{_blank(a.retries)}/{_blank(a.ooms)}"
            table.add_row(
                who,
                used,
                "",
                "" if a.budget is None else f(int(a.budget)),
                _fmt(f, a.reserved),
                _fmt(f, a.allocated),
                _fmt(f, a.inactive_split),
                "" if util is None else format_percent(util),
                retries,
            )
    if sample.stale_live_files:
        table.caption = f"{sample.stale_live_files} stale live file(s) ignored"
    return table


def _fmt(f: Callable[[int], str], v: int | None) -> str:
    return "" if v is None else f(v)
