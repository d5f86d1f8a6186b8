"""Summarise a big log on several cores, with the result of one pass over it.

Why: finding, parsing and judging a message costs tens of microseconds of Python; a log of
distinct messages cannot be read at disk speed on one core. The log is cut at line breaks into
chunks; each worker process summarises one chunk (`groups.summarise` over `scan.Found`s), and
the parent merges the groups in chunk order, which gives exactly what one pass gives: counts
add up, the first/last lines and the worst cases are the first ones found, as in one pass.

This process reads chunks too: the first one (small) before any worker starts, so that workers
forked afterwards inherit the message shapes it learnt instead of each compiling them again,
then every chunk no worker is free for. A log that fits in the first chunk starts no worker.

Exactness at the cuts: a worker starts reading at its chunk's first character, one pass at
the point where the previous chunk's reading stopped. The two agree whenever that point is not
past the cut (no message runs across it); when one does, the parent reads that chunk itself,
from the right point. Platform clues are read from a window around each message that every
chunk carries whole, so they do not depend on the cut either.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import BrokenExecutor, Future, ProcessPoolExecutor
from typing import Any

from alloctune.diagnose.find import _LOOKBACK, LOOKAHEAD, ReportFinder
from alloctune.diagnose.groups import Group, LogSummary, finish, summarise_found
from alloctune.diagnose.scan import Found, rank_at

CHUNK = 1 << 20  # characters per worker task: big enough that a task costs far more than sending it
HEAD = 1 << 14  # a chunk's first characters, summarised apart (read again when a message runs across its start)
SMALL = 1 << 19  # characters per chunk this process reads itself: it looks for an idle worker this often
FIRST = 1 << 18  # the first chunk, read here before any worker starts (it learns the shapes they inherit)
PIPE = 1 << 20  # bytes the pool's pipes hold where the OS lets them grow (`_wide_pipes`)
_FAST = None  # a process's templates, kept from task to task (and inherited by forked workers)


def workers() -> int:
    """Processes to use, this one included: ALLOCTUNE_WORKERS when it is a number, else (unset or
    `auto`) this one plus one per idle CPU, at most 8: the CPUs this process may run on less the
    work of others, a CPU counting as idle when a quarter of it is. The work of others is the
    1-minute load average, or where the kernel says how many threads are runnable now (Linux),
    the smaller of the two: the average still counts processes that ended seconds ago (a run right
    after another). Why not every CPU: on a machine whose cores are busy with other work, the
    extra processes cost more than they bring (bench/diagnose_speed.py). Extra processes start
    only for a log longer than its first chunk (`summarise_parallel`)."""
    env = os.environ.get("ALLOCTUNE_WORKERS", "").strip().lower()
    if env.isdigit() and int(env) > 0:
        return int(env)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows): every CPU
        load = 0.0
    now = _running_elsewhere()
    if now is not None:
        load = min(load, now)
    return max(1, min(cpus, 8, int(cpus - load + 0.75) + 1))


def _running_elsewhere() -> int | None:
    """Threads runnable right now besides this one (`procs_running` of /proc/stat), or None where
    the kernel does not say."""
    try:
        with open("/proc/stat", "rb") as fh:
            for line in fh:
                if line.startswith(b"procs_running "):
                    return max(0, int(line.split()[1]) - 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _found(text: str, begin: int, stop: int, base: int, line: int, platform: str | None, out: dict[str, int]) -> Iterator[Found]:
    """The messages starting in text[begin:stop] (text[0] is at `base` in the log, text[begin] on
    `line`); `out["pos"]` is where one pass would go on reading afterwards."""
    global _FAST
    if _FAST is None:
        from alloctune.diagnose.fast import FastReader

        _FAST = FastReader()
    # The shapes learnt in earlier chunks of this process; the clues indexed at once (a chunk is big).
    finder = ReportFinder(platform, fast=_FAST, index_after=0)
    counted = begin
    for r in finder.scan(text, begin, stop, big=True, base=base):
        s = r.span[0] - base
        line += text.count("\n", counted, s)
        counted = s
        yield Found(r, line, rank_at(text, s))
    out["pos"] = finder.pos


def _chunk(text: str, begin: int, stop: int, base: int, line: int, platform: str | None) -> tuple[Any, int, Any, int]:
    """A worker's task: the partial summaries of one chunk's head (its first `HEAD` characters) and
    of the rest, and where one pass would resume after each. Apart so that when a message runs
    across the chunk's start, only the head is read again (`_settled`)."""
    out: dict[str, int] = {}
    mid = min(stop, begin + HEAD)
    head = summarise_found(_found(text, begin, mid, base, line, platform, out), platform)
    at = max(out["pos"], mid)
    tail = summarise_found(_found(text, at, max(stop, at), base, line + text.count("\n", begin, at), platform, out), platform)
    return head, at, tail, out["pos"]


def _settled(task: tuple, result: tuple[Any, int, Any, int], pos: int, platform: str | None) -> tuple[list, int]:
    """(the partial summaries one pass gives for the chunk, where it resumes after it), from the
    chunk's `_chunk` result and where one pass resumed before it (`pos`, in the chunk's text).
    When a message ran across the chunk's start (pos > begin), the chunk is read again from pos:
    only its head, if that reaches the point where the chunk's own reading of its rest began."""
    text, begin, stop, base, line = task
    head, at, tail, end = result
    if pos <= begin:
        return [head, tail], end
    out: dict[str, int] = {}
    line2 = line + text.count("\n", begin, pos)
    if pos < at:
        part = summarise_found(_found(text, pos, min(stop, begin + HEAD), base, line2, platform, out), platform)
        if max(out["pos"], min(stop, begin + HEAD)) == at:  # one pass reads the rest as the chunk did
            return [part, tail], end
    part = summarise_found(_found(text, pos, max(stop, pos), base, line2, platform, out), platform)
    return [part], out["pos"]


def _chunks(pieces: Iterable[str], size: int | Callable[[], int]) -> Iterator[tuple[str, int, int, int, int]]:
    """(text, begin, stop, base, line): each chunk with the context before and after it, `size`
    characters long or as long as `size()` says when the chunk before it has been taken."""
    buf, base, line = "", 0, 1  # buf holds the log from `base` on; chunks start at a line start
    start = 0  # where the next chunk starts, in buf
    eof = False
    it = iter(pieces)
    want = size() if callable(size) else size
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
                if len(buf) - start < want + LOOKAHEAD:
                    break
                cut = buf.rfind("\n", start, start + want)
                stop = cut + 1 if cut >= start else start + want
            lo = max(0, start - _LOOKBACK)
            hi = min(len(buf), stop + LOOKAHEAD)
            yield buf[lo:hi], start - lo, stop - lo, base + lo, line
            want = size() if callable(size) else size
            line += buf.count("\n", start, stop)
            start = stop
            if start > _LOOKBACK:  # keep only the context the next chunk needs
                drop = start - _LOOKBACK
                buf, base, start = buf[drop:], base + drop, start - drop


def summarise_parallel(
    pieces: Iterable[str],
    platform: str | None = None,
    n: int | None = None,
    size: int = CHUNK,
    small: int = SMALL,
    first: int = FIRST,
) -> LogSummary:
    """`groups.summarise` over the log on `n` processes: this one and n - 1 workers. This one reads
    the first chunk, then hands a chunk of `size` to each idle worker and reads chunks of `small`
    itself in between; workers start only when there is a second chunk. Memory: at most 4n chunks
    in flight, and the groups."""
    n = n or workers()
    parts = Merged()
    pos = 0  # where one pass would resume, in the log
    pool: ProcessPoolExecutor | None = None
    pending: deque[tuple[Future, tuple]] = deque()  # in log order; chunks read here are done already
    to_worker = False  # whether the chunk being cut goes to a worker
    cut = 0  # chunks cut so far

    def settle(fut: Future, task: tuple) -> None:
        nonlocal pos
        try:
            result = fut.result()
        except BrokenExecutor:  # a worker died (killed, out of memory): this process reads its chunk
            result = _chunk(*task, platform)
            no_workers()
        base = task[3]
        done, end = _settled(task, result, pos - base, platform)
        for part in done:
            parts.add(part)
        pos = end + base

    def no_workers() -> None:
        nonlocal n
        n = 1  # the rest of the log in this process

    def next_size() -> int:
        nonlocal to_worker
        started = cut > 0
        # two chunks per worker: the next one travels through the pipe while it reads the one before
        to_worker = n > 1 and started and sum(1 for fut, _ in pending if not fut.done()) < 2 * (n - 1)
        return size if to_worker else small if started else first

    # The pool's threads carry chunks and results through pipes in 64 KiB writes, each after taking
    # the GIL from this thread: at the default 5 ms switch interval a 1 MB chunk took ~150 ms.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, 0.0005))
    try:
        for task in _chunks(pieces, next_size):
            cut += 1
            fut = None
            if to_worker:
                try:
                    if pool is None:  # forked now: the workers inherit the shapes learnt so far
                        pool = ProcessPoolExecutor(max_workers=n - 1)
                        _wide_pipes(pool)
                    fut = pool.submit(_chunk, *task, platform)
                except (OSError, NotImplementedError, BrokenExecutor):  # no processes here (a sandbox)
                    no_workers()
            if fut is None:
                fut = Future()
                fut.set_result(_chunk(*task, platform))
            pending.append((fut, task))
            while pending and (pending[0][0].done() or len(pending) > 4 * n):
                settle(*pending.popleft())
        while pending:
            settle(*pending.popleft())
    finally:
        sys.setswitchinterval(interval)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return parts.finish()


def _wide_pipes(pool: ProcessPoolExecutor) -> None:
    """Let the pool's pipes hold a whole chunk and a whole result (Linux, where they hold 64 KiB):
    a worker's result (~0.7 MB for a chunk of a log of many groups) is then written at once,
    instead of in 64 KiB steps, each waiting for this process's reader thread to get the GIL
    from the thread that reads chunks here. Best effort: the pool works as it is without it."""
    if not sys.platform.startswith("linux"):
        return
    import fcntl

    for queue in (getattr(pool, "_result_queue", None), getattr(pool, "_call_queue", None)):
        for end in (getattr(queue, "_reader", None), getattr(queue, "_writer", None)):
            try:
                fcntl.fcntl(end.fileno(), fcntl.F_SETPIPE_SZ, PIPE)
            except (AttributeError, OSError, ValueError):
                pass  # (not a pipe, or over /proc/sys/fs/pipe-max-size: the default size stays)


class Merged:
    """Consecutive chunks' partial summaries folded in as they are settled, so that memory holds
    the groups, not every chunk's (a long log has hundreds of chunks)."""

    def __init__(self) -> None:
        self.groups: dict[tuple, Group] = {}
        self.total = 0
        self.first: Any = None
        self.same = True

    def add(self, part: Any) -> None:
        if part.count == 0:
            return
        if self.first is None:
            self.first = part
        elif not part.same or part.first_text != self.first.first_text:
            self.same = False
        self.same = self.same and part.same
        self.total += part.count
        for key, g in part.groups.items():
            if key in self.groups:
                self.groups[key].merge(g)
            else:
                self.groups[key] = g
        if self.first is not part:
            part.groups = {}  # its groups now live in (or were merged into) ours

    def finish(self) -> LogSummary:
        first = self.first
        return finish(
            self.groups,
            self.total,
            first.first if first is not None and self.same else None,
            first.platform if first is not None else None,
        )


def merge(parts: list[Any]) -> LogSummary:
    """The summary of consecutive chunks' partial summaries, as one pass would give it."""
    merged = Merged()
    for part in parts:
        merged.add(part)
    return merged.finish()
