"""Summarise a big log on several cores, with the result of one pass over it.

Why: finding, parsing and judging a message costs tens of microseconds of Python; a log of
distinct messages cannot be read at disk speed on one core. The log is cut at line breaks into
chunks; each worker process summarises one chunk (`groups.summarise` over `scan.Found`s), and
the parent merges the groups in chunk order, which gives exactly what one pass gives: counts
add up, the first/last lines and the worst cases are the first ones found, as in one pass.

Exactness at the cuts: a worker starts reading at its chunk's first character, one pass at
the point where the previous chunk's reading stopped. The two agree whenever that point is not
past the cut (no message runs across it); when one does, the parent reads that chunk itself,
from the right point. Platform clues are read from a window around each message that every
chunk carries whole, so they do not depend on the cut either.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from alloctune.diagnose.find import _LOOKBACK, LOOKAHEAD, ReportFinder
from alloctune.diagnose.groups import Group, LogSummary, finish, summarise_found
from alloctune.diagnose.scan import Found, rank_at

CHUNK = 4 << 20  # characters per task: big enough that a task costs far more than sending it
_FAST = None  # a worker's templates, kept from task to task


def workers() -> int:
    """Processes to use: ALLOCTUNE_WORKERS (`auto`: the CPUs this process may run on, at most 8);
    1 (one pass in this process) when unset. Opt-in: on a machine whose cores are busy with
    other work, the extra processes cost more than they bring (bench/diagnose_speed.py)."""
    env = os.environ.get("ALLOCTUNE_WORKERS", "").strip().lower()
    if env == "auto":
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, min(n, 8))
    return int(env) if env.isdigit() and int(env) > 0 else 1


def _found(text: str, begin: int, stop: int, base: int, line: int, platform: str | None,
           out: dict[str, int]) -> Iterator[Found]:
    """The messages starting in text[begin:stop] (text[0] is at `base` in the log, text[begin] on
    `line`); `out["pos"]` is where one pass would go on reading afterwards."""
    global _FAST
    if _FAST is None:
        from alloctune.diagnose.fast import FastReader

        _FAST = FastReader()
    finder = ReportFinder(platform, fast=_FAST)  # the shapes learnt in earlier chunks of this process
    counted = begin
    for r in finder.scan(text, begin, stop, big=True, base=base):
        s = r.span[0] - base
        line += text.count("\n", counted, s)
        counted = s
        yield Found(r, line, rank_at(text, s))
    out["pos"] = finder.pos


def _chunk(text: str, begin: int, stop: int, base: int, line: int, platform: str | None) -> tuple[Any, int]:
    """A worker's task: the partial summary of one chunk and where one pass would resume."""
    out: dict[str, int] = {}
    part = summarise_found(_found(text, begin, stop, base, line, platform, out), platform)
    return part, out["pos"]


def _chunks(pieces: Iterable[str], size: int) -> Iterator[tuple[str, int, int, int, int]]:
    """(text, begin, stop, base, line): each chunk with the context before and after it."""
    buf, base, line = "", 0, 1  # buf holds the log from `base` on; chunks start at a line start
    start = 0  # where the next chunk starts, in buf
    eof = False
    it = iter(pieces)
    while not eof:
        piece = next(it, None)
        eof = piece is None
        if piece:
            buf += piece
        while True:
            if eof:
                if start >= len(buf):
                    return
                stop = len(buf)
            else:
                if len(buf) - start < size + LOOKAHEAD:
                    break
                cut = buf.rfind("\n", start, start + size)
                stop = cut + 1 if cut >= start else start + size
            lo = max(0, start - _LOOKBACK)
            hi = min(len(buf), stop + LOOKAHEAD)
            yield buf[lo:hi], start - lo, stop - lo, base + lo, line
            line += buf.count("\n", start, stop)
            start = stop
            if start > _LOOKBACK:  # keep only the context the next chunk needs
                drop = start - _LOOKBACK
                buf, base, start = buf[drop:], base + drop, start - drop


def summarise_parallel(pieces: Iterable[str], platform: str | None = None, n: int | None = None,
                       size: int = CHUNK) -> LogSummary:
    """`groups.summarise` over the log, chunk by chunk on `n` processes (bounded: at most 2n
    chunks in flight)."""
    n = n or workers()
    parts: list[Any] = []
    pos = 0  # where one pass would resume, in the log
    with ProcessPoolExecutor(max_workers=n) as pool:
        pending: list[tuple[Future, tuple]] = []

        def settle(fut: Future, task: tuple) -> None:
            nonlocal pos
            text, begin, stop, base, line = task
            if pos > base + begin:  # a message ran across the cut: read this chunk from there
                out: dict[str, int] = {}
                skip = pos - base
                line2 = line + text.count("\n", begin, skip)
                part = summarise_found(_found(text, skip, max(stop, skip), base, line2, platform, out), platform)
                fut.cancel()
                parts.append(part)
                pos = out["pos"] + base
                return
            part, end = fut.result()
            parts.append(part)
            pos = end + base

        for task in _chunks(pieces, size):
            pending.append((pool.submit(_chunk, *task, platform), task))
            while len(pending) >= 2 * n:
                settle(*pending.pop(0))
        for fut, task in pending:
            settle(fut, task)
    return merge(parts)


def merge(parts: list[Any]) -> LogSummary:
    """The summary of consecutive chunks' partial summaries, as one pass would give it."""
    groups: dict[tuple, Group] = {}
    total = 0
    first = None
    same = True
    for part in parts:
        if part.count == 0:
            continue
        if first is None:
            first = part
        elif not part.same or part.first_text != first.first_text:
            same = False
        same = same and part.same
        total += part.count
        for key, g in part.groups.items():
            if key in groups:
                groups[key].merge(g)
            else:
                groups[key] = g
    return finish(groups, total, first.first if first is not None and same else None,
                  first.platform if first is not None else None)
