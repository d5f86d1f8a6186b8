"""Issue 30, item 4: the C matcher of message templates (`diagnose/_templates.c`) against its
Python twin, the template's regular expression and `fast.collapse`, and both against the grammar.

The C path must give the very reports the regex path gives (and the grammar gives) on real
message forms and on the inputs most likely to split them: other scripts' digits, full-width
punctuation, blank runs and line breaks inside a message, figures too long for a machine
integer or a double, units without a multiplier, ties that `round` breaks to even."""

from __future__ import annotations

import json
import random
import re

import pytest

from alloctune.diagnose import fast
from alloctune.diagnose.native import templates
from alloctune.diagnose.find import BIG_TEXT, ReportFinder, find_reports

native = pytest.importorskip("alloctune.diagnose._templates")


@pytest.fixture
def regex_path(monkeypatch):
    """A function running `scan` with the regex path (ALLOCTUNE_TEMPLATES=python), fresh templates."""

    def scan(text: str) -> tuple[list, ReportFinder]:
        monkeypatch.setenv("ALLOCTUNE_TEMPLATES", "python")
        templates.cache_clear()
        try:
            finder = ReportFinder()
            return list(finder.scan(text, 0, len(text), big=len(text) > BIG_TEXT)), finder
        finally:
            monkeypatch.delenv("ALLOCTUNE_TEMPLATES")
            templates.cache_clear()

    return scan


def native_scan(text: str) -> tuple[list, ReportFinder]:
    templates.cache_clear()
    assert templates() is native
    finder = ReportFinder()
    return list(finder.scan(text, 0, len(text), big=len(text) > BIG_TEXT)), finder


def one_line_forms(corpus) -> list[str]:
    forms = []
    for line in corpus.read_text(encoding="utf-8").splitlines():
        if line.strip():
            forms += [r.raw for r in find_reports(json.loads(line)["text"]) if "\n" not in r.raw]
    assert len(forms) >= 60
    return forms


_NUM = re.compile(r"\d+(?:\.\d+)?")
_ARABIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
_WIDE = str.maketrans({";": "；", ":": "：", "(": "（", ")": "）", ",": "，"})


def mutated(form: str, rnd: random.Random, hostile: float = 1.0) -> str:
    """`form` with its numbers and blanks drawn again, the way hostile or odd logs write them
    (`hostile`: the share of numbers drawn from the odd kinds, the others plain)."""

    def number(m: re.Match[str]) -> str:
        if "." not in m.group() and rnd.random() > hostile:
            return str(rnd.randrange(0, 10 ** len(m.group())))  # a device or pid stays whole
        kind = rnd.randrange(9) if rnd.random() < hostile else 8
        if kind == 0:
            return str(rnd.randrange(10**19, 10**40))  # beyond a 64-bit integer
        if kind == 1:
            return "9" * rnd.choice((309, 400))  # beyond a double: inf, the Python way decides
        if kind == 2:
            return f"{rnd.randrange(0, 2000)}.5"  # a tie when the unit is bytes: round half to even
        if kind == 3:
            return f"{rnd.randrange(0, 10**6)}.{rnd.randrange(0, 10**9):09d}"  # 15+ digits: strtod's way
        if kind == 4:
            return m.group().translate(_ARABIC)  # another script's digits: the grammar's way
        if kind == 5:
            return "0" * rnd.randrange(1, 4) + m.group()
        return f"{rnd.uniform(0, 1024):.{rnd.randrange(0, 4)}f}"

    msg = _NUM.sub(number, form)
    r = rnd.random()
    if r < 0.15:
        msg = msg.replace(" ", rnd.choice(("  ", " \t", "\t")), rnd.randrange(1, 4))
    elif r < 0.25:
        msg = msg.translate(_WIDE)
    elif r < 0.3:
        msg = re.sub(r"(GiB|MiB|KiB|GB|MB)", rnd.choice(("PiB", "PB", "TiB", "bytes")), msg, count=2)
    elif r < 0.35:
        msg = re.sub(r"(\d) (GiB|MiB)", r"\1\2", msg)  # no space before the unit
    elif r < 0.4:
        msg = re.sub(r"(GiB|MiB)", r"\1s", msg, count=1)  # a letter after the unit: no size there
    return msg


def test_native_templates_read_what_the_regex_and_the_grammar_read(oom_corpus, regex_path):
    forms = one_line_forms(oom_corpus)
    rnd = random.Random(30)
    lines = []
    for k in range(3000):
        form = forms[k % len(forms)]
        lines.append(f"[rank{k % 8}] step {k}: " + (form if k < len(forms) else mutated(form, rnd)))
        if k % 7 == 0:
            lines.append("INFO continuing")
    text = "\n".join(lines) + "\n"
    got, finder = native_scan(text)
    want, _ = regex_path(text)
    # (a message whose request cannot be read -- beyond a double, a unit PyTorch never prints -- is
    # not taken for one: its head alone, after "step K:", is prose to the finder)
    assert len(got) == len(want) >= 2400
    assert got == want
    grammar = list(ReportFinder(fast=False).scan(text, 0, len(text), big=len(text) > BIG_TEXT))
    assert got == grammar
    progs = [t for slot in finder.fast.templates.values() for t in slot]
    assert progs and all(t.prog is not None for t in progs)  # every shape went through C here


def test_native_match_equals_the_regex_match_figure_by_figure(oom_corpus):
    """Below the reports: for every template and mutated message, C says no match exactly where
    the regex does, and where both match, the same end, figures and normalised text (or it hands
    the message to the Python way, which the reports test covers)."""
    forms = one_line_forms(oom_corpus)
    finder = ReportFinder()
    text = "\n".join(forms) + "\n"
    list(finder.scan(text, 0, len(text), big=False))
    templates = [t for slot in finder.fast.templates.values() for t in slot]
    assert len(templates) >= 20
    rnd = random.Random(4)
    compared = handed_back = 0
    for _ in range(6000):
        t = rnd.choice(templates)
        msg = mutated(t.proto.raw, rnd, hostile=0.1)
        pad = rnd.choice(("", "x", "[rank3] ", "é", "中文 "))
        s = len(pad)
        subject = pad + msg + rnd.choice(("", "\n", " tail", "B"))
        m = t.rx.match(subject, s)
        hit = native.match(t.prog, subject, s)
        if m is None:
            assert hit is None, (t.rx.pattern[:80], subject)
            continue
        assert hit is not None, (t.rx.pattern[:80], subject)
        if hit is False:
            handed_back += 1
            continue
        want: dict = {}
        t._figures(m.groups(), want)  # the regex path's reading of every figure
        got: dict = {}
        procs = fast._place(zip(t.targets, hit[1]), got)
        assert hit[0] == m.end()
        assert got == {k: v for k, v in want.items() if k != "other_processes"}, subject
        assert procs == want.get("other_processes", ())
        assert hit[2] == fast.collapse(subject[s:m.end()])
        compared += 1
    assert compared > 2000 and handed_back > 50


def test_key_equals_the_python_key():
    rnd = random.Random(5)
    alphabet = "0123456789 abcXYZ.;:()（）；é中\U0001f600\ud800"
    for _ in range(5000):
        text = "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(0, 260)))
        s = rnd.randrange(0, len(text) + 2)
        assert native.key(text, s) == fast.FastReader.key(text, s), (text, s)


def test_find_any_equals_the_needle_regex():
    from alloctune.diagnose.platform import _ANY_NEEDLE, _NEEDLES

    rnd = random.Random(6)
    alphabet = "WSL/mnt:\\windows_portableWin1.exe nvcudamacOSDarwin/Users/home/usr/opt/conda dist-packages UbuntuLinux é中"
    for _ in range(20000):
        text = "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(0, 50)))
        start = rnd.randrange(0, 6)
        m = _ANY_NEEDLE.search(text, start)
        assert native.find_any(text, _NEEDLES, start) == (m.start() if m else -1), (text, start)


def test_without_the_extension_the_regex_reads_every_message(monkeypatch, oom_corpus):
    monkeypatch.setenv("ALLOCTUNE_TEMPLATES", "python")
    templates.cache_clear()
    try:
        assert templates() is None
        text = "\n".join(one_line_forms(oom_corpus)[:20]) + "\n"
        finder = ReportFinder()
        list(finder.scan(text, 0, len(text), big=False))
        assert all(t.prog is None for slot in finder.fast.templates.values() for t in slot)
    finally:
        monkeypatch.delenv("ALLOCTUNE_TEMPLATES")
        templates.cache_clear()


@pytest.mark.parametrize("message", [
    "RuntimeError: CUDA out of memory. Tried to allocate {nines} GiB (GPU 0; 8.00 GiB total capacity; "
    "1.00 GiB already allocated; 0 bytes free; 2.00 GiB reserved in total by PyTorch)",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {sevens} has a total capacity of "
    "8.00 GiB of which 1.00 GiB is free. Of the allocated memory 6.00 GiB is allocated by PyTorch, and {nines} MiB "
    "is reserved by PyTorch but unallocated.",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 187.50 PB. GPU 0 has a total capacity of 8.00 GiB "
    "of which 1.00 GiB is free.",
])
@pytest.mark.parametrize("way", ["native", "python"])
def test_a_figure_no_number_type_holds_is_refused_not_a_traceback(capsys, monkeypatch, message, way):
    """Hundreds of digits (beyond a double), thousands (beyond int()'s limit), a unit PyTorch never
    prints: the clause holding it is refused (before: 'internal error: OverflowError'), through
    the templates (the same message learnt first with plain figures) as through the grammar."""
    from cli_run import run_cli

    if way == "python":
        monkeypatch.setenv("ALLOCTUNE_TEMPLATES", "python")
    templates.cache_clear()
    plain = re.sub(r"\{(nines|sevens)\}", "3", message)
    text = message.format(nines="9" * 400, sevens="7" * 5000)
    log = f"[rank0] {plain}\n[rank1] {text}\n[rank0] {plain}\n"
    try:
        monkeypatch.setattr("sys.stdin", __import__("io").TextIOWrapper(__import__("io").BytesIO(log.encode())))
        code, out, err = run_cli(capsys, "diagnose", "-", "--json")
    finally:
        templates.cache_clear()
    assert code == 0, err
    assert "internal error" not in err
    got = json.loads(out)
    assert got["messages"] >= 2
    assert list(ReportFinder().scan(log, 0, len(log), big=False)) == list(
        ReportFinder(fast=False).scan(log, 0, len(log), big=False))
