"""Issue 30, item 1: an OOM message is recognised by its content wherever it stands and however
a terminal or a log collector cut it. Every real message of the corpus is re-shaped the way real
logs re-shape lines (rank/step prefixes, hard wraps, Kubernetes partial lines, Docker and Python
JSON logs, CI timestamps) and must still give every figure it prints, read independently of the
parser by a plain "<number> <unit>" regex."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest

from alloctune.diagnose import find_reports

FIGURE = re.compile(r"(\d+(?:\.\d+)?)\s*(bytes|KiB|MiB|GiB|TiB|KB|MB|GB)(?![A-Za-z])")
UNIT = {"bytes": 1, "KiB": 2**10, "KB": 2**10, "MiB": 2**20, "MB": 2**20, "GiB": 2**30, "GB": 2**30, "TiB": 2**40}


def _close(num: str, unit: str, value: int) -> bool:
    exact = Decimal(num) * UNIT[unit]
    decimals = len(num.split(".")[1]) if "." in num else 0
    slack = Decimal(UNIT[unit]) / (2 * 10**decimals) if unit != "bytes" else Decimal(0)
    return abs(Decimal(value) - exact) <= slack + 1


def fold(text: str, width: int) -> str:
    """A terminal's hard wrap: every line cut at `width` characters, words or not."""
    out = []
    for line in text.split("\n"):
        while len(line) > width:
            out.append(line[:width])
            line = line[width:]
        out.append(line)
    return "\n".join(out)


def cri(text: str, width: int = 100) -> str:
    """containerd/Kubernetes: long lines split in pieces marked P (partial), the last one F."""
    out = []
    for line in text.split("\n"):
        pieces = [line[i:i + width] for i in range(0, max(len(line), 1), width)]
        out += [f"2026-05-01T10:00:00.{i:09d}Z stderr {'P' if i < len(pieces) - 1 else 'F'} {p}"
                for i, p in enumerate(pieces)]
    return "\n".join(out)


SHAPES = {
    "rank-step-prefix": lambda m: f"[rank3] step 12: {m}\n[rank3] step 13: resuming\n",
    "hard-wrap-80": lambda m: fold(m, 80),
    "hard-wrap-120-with-prefix": lambda m: fold("[rank0]: " + m, 120),
    "hard-wrap-crlf": lambda m: fold(m, 100).replace("\n", "\r\n"),
    "kubernetes-partial-lines": cri,
    "docker-json": lambda m: json.dumps({"log": m + "\n", "stream": "stderr"}, ensure_ascii=False),
    "python-json-ascii": lambda m: json.dumps({"level": "ERROR", "message": m}),
    "ci-timestamps": lambda m: "\n".join("2025-11-14T08:52:38.3746210Z " + ln for ln in m.split("\n")),
    "log-fields-after": lambda m: f"2026-05-01 10:00:00,123 ERROR trainer: {m} | step=12 loss=nan",
}


def _messages(corpus_path):
    """(id, raw message) for every message of the corpus that prints at least one figure."""
    out = []
    for line in corpus_path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            e = json.loads(line)
            out += [(e["id"], r.raw) for r in find_reports(e["text"]) if FIGURE.search(r.raw)]
    return out


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_corpus_message_survives_the_shape(oom_corpus, shape):
    misses = []
    for mid, raw in _messages(oom_corpus):
        text = SHAPES[shape](raw)
        reports = find_reports(text)
        if len(reports) != 1:
            misses.append(f"{mid}: {len(reports)} reports")
            continue
        values = list(reports[0].figures().values())
        lost = [f"{n} {u}" for n, u in FIGURE.findall(raw) if not any(_close(n, u, v) for v in values)]
        if lost:
            misses.append(f"{mid}: lost {lost}")
    assert misses == []


@pytest.mark.parametrize("text,fmt", [
    # ComfyUI / InvokeAI style: the short form, then the GUI's own words on the same line
    ("torch.OutOfMemoryError: Allocation on device  (node 12: KSampler, 1024x1024)", "cudamallocasync"),
    ("!!! Exception during processing !!! Allocation on device 0 - retrying with tiled VAE", "cudamallocasync"),
    ("2025-10-07T08:14:09.526719Z Allocation on device ", "cudamallocasync"),  # a CI timestamp only
    ('{"log":"Allocation on device \\n","stream":"stderr"}', "cudamallocasync"),  # Docker's JSON log
    ("[rank3] step 12: torch.OutOfMemoryError: CUDA out of memory. (see above)", "2.2+"),
    ("2026-05-01 10:00:00 ERROR - CUDA out of memory (retrying in 5s)", "2.2+"),
    ('{"message": "Aloca\\u00e7\\u00e3o no dispositivo", "level": "error"}', "cudamallocasync"),
])
def test_short_forms_with_surroundings(text, fmt):
    reports = find_reports(text)
    assert [r.format for r in reports] == [fmt]


@pytest.mark.parametrize("text", [
    "Allocation on device memory is slower than on the host",
    "I meet CUDA out of memory when I run the test code",
    'he said "CUDA out of memory" happens sometimes',
])
def test_prose_is_still_not_a_message(text):
    assert find_reports(text) == []


def test_a_wrapped_url_and_version_hint_are_kept():
    """The docs URL decides the torch-version hint: a wrap inside it must not lose it."""
    msg = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "79.15 GiB of which 1.23 GiB is free. Of the allocated memory 70.12 GiB is allocated by PyTorch, and 6.23 "
           "GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
           "Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-"
           "cuda-alloc-conf)")
    whole = find_reports(msg)[0]
    for width in (60, 77, 80, 100, 132):
        r = find_reports(fold(msg, width))[0]
        assert (r.docs_url, r.torch_hint, r.figures()) == (whole.docs_url, whole.torch_hint, whole.figures()), width
