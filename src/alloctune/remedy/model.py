"""What a remedy is: a rewrite of the recording plus its min budget, its code line and its method.

The field's standard advice ("call empty_cache() now and then", "run the Janitor", "cap the cuBLAS
workspace", "checkpoint the layers") is a number here: the recording's request stream rewritten the
way the remedy would change the program's requests (`spliced`: the untouched requests copied in
bulk), replayed once uncapped for its peak reserved and the driver calls it adds (each released
segment is a cudaFree now and a cudaMalloc later), and that replay handed to `sim.sweep`'s bisection
as its first probe for the min budget at the one resolution (`sim.resolution`, so `simulate
--min-budget` of the written file answers the same number): `simulated`. Where no rewrite
is exact (autograd off, cuDNN's algorithms) the remedy is measured by a run of the program with it
(`remedy.measured`), or carries the command of the run that would confirm it.

The time cost is an upper bound from the driver-call figures measured on the H200
(bench/results/driver_cost.md: 0.1 ms a call plus 2 µs per MiB, the same constants `tune` bounds
throughput with).
"""

from __future__ import annotations

import contextlib
import gc
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Hashable, Iterator, Mapping, Sequence

from alloctune.sim import native
from alloctune.sim.resolution import ABS_TOL, REL_TOL
from alloctune.trace.model import Annotation, RequestStream, Trace
from alloctune.units import utilization

if TYPE_CHECKING:
    from alloctune.sim.replay import SimResult

# Driver work, as measured on the H200 (bench/results/driver_cost.md); tune's TuneSettings defaults.
DRIVER_CALL_S = 1e-4
DRIVER_MIB_S = 2e-6
SIMULATED, MEASURED, UNCONFIRMED = "simulated", "measured", "needs a confirming run"
SWITCH_INTERVAL = 0.0002  # seconds: how soon a thread back from native work gets the GIL (`Shared`)


@dataclass(frozen=True)
class Remedy:
    """One program-level remedy and what it buys, for the user's own program.

    `name`: a stable key (`empty_cache_each_repetition`, `janitor`, `no_grad`, ...); `what`: the
    sentence; `method`: simulated (replayed on the recording), measured (a run of the program
    with it), or "needs a confirming run" (`confirm` says which); `min_budget`: for the latter,
    None (`bound` may hold the simulated lower bound); with `bound` below it, a range."""

    name: str
    what: str
    min_budget: int | None
    saving: int | None  # the min budget without it minus with it (negative: it costs memory)
    peak_reserved: int | None  # uncapped
    peak_allocated: int | None
    extra_driver_calls: int  # cudaMalloc + cudaFree beyond the recording's, uncapped
    extra_seconds: float  # upper bound on the time those calls add
    how_to: str  # what to write (or set) to get it
    method: str = SIMULATED
    conf: str = ""  # the allocator setting it was simulated / measured under
    confirm: str | None = None  # the command of the run that would confirm it
    # the low end of min_budget's range: a simulated lower bound (every workspace-shaped request no
    # evidence covers given up, `workspace_floor`), or the only number known when min_budget is None
    bound: int | None = None
    cleanups: int | None = None  # empty_cache() calls it makes (release policies)
    # how a service gets it: {"args": guard.Janitor(...) keyword arguments, "use": "janitor" (`with janitor:`
    # around each request) or "janitor.request(size)" (`with janitor.request(size):`)}
    janitor: dict[str, Any] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    trace: Any = field(default=None, repr=False, compare=False)  # the rewritten recording (not in JSON)

    @classmethod
    def unconfirmed(
        cls,
        name: str,
        what: str,
        how_to: str,
        conf: str,
        *,
        confirm: str,
        notes: tuple[str, ...] = (),
        bound: int | None = None,
    ) -> "Remedy":
        """A remedy nothing has measured yet: no min budget, no peaks, no driver calls; `confirm` is the run that
        would measure it, `bound` a simulated lower bound where one is known."""
        return cls(
            name, what, None, None, None, None, 0, 0.0, how_to, UNCONFIRMED, conf, confirm=confirm, bound=bound, notes=notes
        )

    @property
    def utilization(self) -> float | None:
        """peak allocated ÷ peak reserved (`units.utilization`)."""
        return utilization(self.peak_allocated, self.peak_reserved)

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("trace")
        d["notes"] = list(self.notes)
        d["utilization"] = self.utilization
        d["code"] = self.how_to  # the line to write, under the name every remedy row shares
        if self.bound is not None and self.min_budget is not None and self.bound < self.min_budget:
            d["min_budget_range"] = [self.bound, self.min_budget]
        return d


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while remedies are simulated (back as it was after).

    Why: each rewritten recording is a few lists of a million ints, and a full collection visits
    every item of every list it tracks; with a dozen of them alive (each remedy keeps its own) the
    collections that the rewrites' small objects trigger cost seconds, and find next to nothing
    (the rewrites make no reference cycles)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def recorded_conf(trace: Trace) -> str:
    """The allocator string the recording ran with ("" = defaults)."""
    conf = (trace.meta or {}).get("conf")
    if isinstance(conf, str):
        return conf
    text = (trace.allocator_settings or {}).get("PYTORCH_CUDA_ALLOC_CONF")
    return text if isinstance(text, str) else ""


def rewritten(trace: Trace, out: RequestStream, new_index: list[int] | memoryview) -> Trace:
    """`trace` with its requests replaced by `out`; `new_index[r]` is where old request r went (its
    fallbacks and the segment events that happened at it follow it)."""
    req = trace.requests
    n_out = len(out)
    new_index[len(req)] = n_out
    out.fallbacks = {new_index[i]: v for i, v in req.fallbacks.items()}
    if req.stack_ids is not None and out.stack_ids is None:  # each kept request keeps its call site
        ids = [-1] * n_out
        old_ids, old_rids, old_ops, out_rids, out_ops = req.stack_ids, req.rids, req.ops, out.rids, out.ops
        for r in range(len(req)):
            k = new_index[r]
            if k < n_out and out_rids[k] == old_rids[r] and out_ops[k] == old_ops[r]:
                ids[k] = old_ids[r]
        out.stack_ids, out.stack_table = ids, req.stack_table
    if req.annotations and not out.annotations:  # each range keeps the requests it held
        out.annotations = [Annotation(a.name, new_index[a.start], new_index[a.end]) for a in req.annotations]
    seg = [replace(e, request_index=new_index[min(e.request_index, len(req))]) for e in trace.segment_events]
    return Trace(
        source=trace.source,
        device=trace.device,
        requests=out,
        segment_events=seg,
        allocator_settings=dict(trace.allocator_settings),
        events=[],
        meta=dict(trace.meta or {}),
        total_memory=trace.total_memory,
    )


# One request of a rewrite: (op, size, rid, stream, event index, stack id; -1 = no call site)
Row = tuple[int, int, int, int, int, int]


def spliced(
    trace: Trace, before: Mapping[int, Sequence[Row]], changed: Mapping[int, Row | None], *, given_stacks: bool = False
) -> Trace:
    """`trace` with rows put in and requests changed or dropped (`rewritten`), the requests between
    them copied in bulk: the rows of `before[r]` go just before request r (`before[len]`: at the end),
    `changed[r]` takes request r's place (None: request r is dropped); `before` keys lie in [0, len],
    `changed` keys in [0, len).

    Call sites: every kept request keeps its own; a row put in or changed has the stack id it carries
    when `given_stacks`, else the one `rewritten` gives it (that of an old request whose new place it
    takes with the same rid and op).

    The copying runs in the native core when it is built (`sim.native.splice`: a rewrite that puts an
    empty_cache() after each of 50 000 steps copies 50 000 runs of requests, which costs Python ~0.2 s
    per million requests); `_spliced_lists` is its specification."""
    req = trace.requests
    cols = (req.ops, req.sizes, req.rids, req.streams, req.event_index)
    keys = sorted(set(before) | set(changed))
    done = native.splice(cols, req.stack_ids, keys, dict(before), dict(changed), given_stacks, native.cached_columns(req))
    new_index: list[int] | memoryview
    if done is None:
        out, new_index, made = _spliced_lists(trace, before, changed, given_stacks)
    else:
        (ops, sizes, rids, streams, event_index), ids, new_index, made_at, cols64 = done
        out = RequestStream(ops, sizes, rids, streams, event_index)
        out.stack_ids = ids
        made = set(made_at)
        if cols64 is not None:  # the replay core's columns of the new stream, made along with it
            native.keep_columns(out, cols64)
    old_ids = req.stack_ids
    if out.stack_ids is not None and old_ids is not None and not given_stacks:
        n_out, ids_out = len(out.ops), out.stack_ids
        for r in sorted(changed):  # in request order, as `rewritten` assigns them (a later one wins)
            k = new_index[r]
            if k < n_out and k in made and out.rids[k] == req.rids[r] and out.ops[k] == req.ops[r]:
                ids_out[k] = old_ids[r]
    if out.stack_ids is not None:
        out.stack_table = req.stack_table
    return rewritten(trace, out, new_index)


def _spliced_lists(
    trace: Trace, before: Mapping[int, Sequence[Row]], changed: Mapping[int, Row | None], given_stacks: bool
) -> tuple[RequestStream, list[int], set[int]]:
    """`spliced`'s copying in Python: the new stream (stack ids as `spliced` documents, before the
    fix-up of changed rows), where each old request went, and the new positions of the rows."""
    req = trace.requests
    n = len(req)
    old_ids = req.stack_ids
    out = RequestStream()
    ids: list[int] | None = None if old_ids is None else []
    new_index = [0] * (n + 1)
    made: set[int] = set()  # positions of the rows put in or changed

    def put(rows: Sequence[Row]) -> None:
        for row in rows:
            made.add(len(out.ops))
            out.append(row[0], row[1], row[2], row[3], row[4])
            if ids is not None:
                ids.append(row[5] if given_stacks else -1)

    def copy(start: int, stop: int) -> None:
        at = len(out.ops)
        out.extend_from(req, start, stop)
        if ids is not None and old_ids is not None:
            ids.extend(old_ids[start:stop])
        new_index[start:stop] = range(at, at + stop - start)

    prev = 0
    for r in sorted(set(before) | set(changed)):
        if r in before:
            copy(prev, r)
            put(before[r])
            prev = r
        if r >= n:
            break
        if r in changed:
            copy(prev, r)
            new_index[r] = len(out.ops)
            row = changed[r]
            if row is not None:
                put((row,))
            prev = r + 1
    copy(prev, n)
    out.stack_ids = ids
    return out, new_index, made


def uncapped_run(trace: Trace, conf: str, reference: Trace) -> "SimResult":
    """The uncapped replay of `trace` under `conf`: what `activity` reads (its counters: no segment
    events are kept, a clean-up every step makes hundreds of thousands), and the first probe of
    `min_budget`'s bisection (pass it as `uncapped=`), with the states its probes start from
    (`keep_states`)."""
    from alloctune.sim.replay import replay

    return replay(trace, conf or None, reference=reference, record_events=False, timeline_points=1, keep_states=True)


BaseActivity = tuple[int, int, int, int]  # `activity` of the recording as it ran, which remedies compare with


def activity_of(run: "SimResult") -> BaseActivity:
    """(peak reserved, peak allocated, driver calls, MiB reserved or released) of an uncapped replay.

    Read from its counters: every segment event but an OOM changes reserved bytes by its size, so
    the bytes reserved or released are the reserved counter's `allocated` plus its `freed`."""
    st = run.stats
    calls = int(st.get("num_device_alloc", 0)) + int(st.get("num_device_free", 0))
    moved = int(st.get("reserved_bytes.all.allocated", 0)) + int(st.get("reserved_bytes.all.freed", 0))
    return run.peak_reserved, run.peak_allocated, calls, moved >> 20


def activity(trace: Trace, conf: str, reference: Trace) -> tuple[int, int, int, int]:
    """(peak reserved, peak allocated, driver calls, MiB reserved or released) of an uncapped replay."""
    return activity_of(uncapped_run(trace, conf, reference))


def min_budget(trace: Trace, conf: str, reference: Trace, uncapped: "SimResult | None" = None) -> int | None:
    """The min budget of a (rewritten) recording under `conf`, to the one resolution (`sim.resolution`:
    0.2 % or 1 MiB, finer than a remedy's saving of a few percent), so `alloctune simulate ... --min-budget`
    of the written recording answers the same number: `sim.sweep`'s bisection for one setting
    (`sim.budget.min_budget`), started from `uncapped` (`uncapped_run` of this trace) when given."""
    from alloctune.config import AllocatorConfig
    from alloctune.sim.budget import min_budget as bisection
    from alloctune.sim.replay import replay

    config = AllocatorConfig.parse(conf)
    if uncapped is None:  # as `sim.sweep.simulate_setting` makes it
        uncapped = replay(trace, config, record_events=False, timeline_points=1, reference=reference, keep_states=True)
    return bisection(trace, config, rel_tol=REL_TOL, abs_tol=ABS_TOL, uncapped=uncapped, reference=reference).budget


def low_end(trace: Trace) -> Trace | None:
    """`trace` with every workspace-shaped request no evidence covers made fallible down to nothing
    (`trace.fallible.optimistic`), or None when there is none to give up; the same requests, so it
    shares the replay core's columns of `trace`."""
    from alloctune.trace.fallible import optimistic, untagged_note

    if untagged_note(trace) is None:
        return None
    low = optimistic(trace)
    if low is trace:  # nothing more can be given up
        return None
    native.columns(trace.requests)  # made once for both: the same lists (so `trace`'s replay states serve it)
    native.share_columns(trace.requests, low.requests)
    return low


def workspace_floor(
    trace: Trace,
    conf: str,
    reference: Trace,
    need: int | None,
    uncapped: "SimResult | None" = None,
    low_end_of: Callable[[Trace], Trace | None] = low_end,
) -> int | None:
    """The min budget with every workspace-shaped request no evidence covers given up
    (`low_end`), when it lies below `need` (the min budget of the replay as recorded,
    `min_budget(trace, conf, reference)`); else None. `uncapped`: `uncapped_run` of `trace`, when
    at hand; `low_end_of`: `low_end`, or what gives it (`Shared.low_end` keeps it for every setting).

    Why: under a cap cuDNN answers a failed workspace with another algorithm, so a recording
    without C++ frames or a calibration run only brackets the real need: as recorded is the high
    end, this the low one. On the H100's Faster R-CNN (tests/data/remedies_gpu det) the real need
    of the program with empty_cache() after every batch lay 0.04 % above this end and 9 % below
    the other."""
    if need is None:
        return None
    low_trace = low_end_of(trace)
    if low_trace is None:  # nothing can be given up: its min budget is `need` itself
        return None
    # Uncapped, no request fails, so no fallback is ever asked for: the replay of the optimistic
    # recording is the recording's own (same requests, source and setting) whenever that completes.
    low = min_budget(low_trace, conf, reference, uncapped if uncapped is not None and uncapped.completed else None)
    return low if low is not None and low < need else None


class Shared:
    """What the remedies and what-ifs of one recording have in common, made once (one per `explain`).

    * its rewrites, by the rule and arguments that made them (`rewrite`): the release policies make
      the same ones under the recorded setting and under the best compared one, and a growing
      site's what-if is the leak remedy's rewrite;
    * the uncapped replay (`run`) and min budget (`min_budget`) of each recording under a setting,
      all against the recording's own addresses; a rewrite with the recording's very requests is
      the recording (a what-if whose site's kept blocks all die in the last repetition moves
      nothing). A rewrite's replay is kept until its remedy is made (`release`): it holds copies of
      allocator states (`sim.session.Checkpoints`);
    * each rewrite's low end (`low_end`), which no setting changes.

    `background=True` (used as a context manager): the replays and min budgets run in a thread of
    their own, started by `prefetch`. Why: the replay core runs without the GIL, so on a machine
    with two cores they go on while this thread does the Python work of the same remedy (the scans
    of its low end) or of the next; every answer is the one the same call makes in this thread.
    """

    def __init__(self, recording: Trace, background: bool = False) -> None:
        self.recording = recording
        self._rewrites: dict[Hashable, Trace] = {}
        self._alias: dict[int, tuple[Trace, Trace]] = {}  # id(trace) -> (trace, the recording or trace)
        # (id(trace), conf) -> (trace, its uncapped replay / min budget, made or being made)
        self._runs: dict[tuple[int, str], tuple[Trace, Future[SimResult]]] = {}
        self._budgets: dict[tuple[int, str], tuple[Trace, Future[int | None]]] = {}
        self._low_ends: dict[int, tuple[Trace, Trace | None]] = {}
        self._background = background
        self._pool: ThreadPoolExecutor | None = None
        self._interval: float | None = None

    def __enter__(self) -> Shared:
        if self._background:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="alloctune-replays")
            # The thread asks for the GIL back after each stretch of native work; the interpreter hands it
            # over only every switch interval (5 ms by default), which would idle it most of the time
            self._interval = sys.getswitchinterval()
            sys.setswitchinterval(min(self._interval, SWITCH_INTERVAL))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._interval is not None:
            sys.setswitchinterval(self._interval)
            self._interval = None

    def rewrite(self, key: Hashable, make: Callable[[], Trace]) -> Trace:
        """The rewrite `make` makes, made once per `key` (the rule and its arguments)."""
        if key not in self._rewrites:
            self._rewrites[key] = make()
        return self._rewrites[key]

    def _as_recording(self, trace: Trace) -> Trace:
        """The recording when `trace` has its very requests (same source and device memory), else `trace`."""
        if id(trace) not in self._alias:
            r, q, rec = trace.requests, self.recording.requests, self.recording
            same = (
                trace is not rec
                and len(r) == len(q)
                and trace.source == rec.source
                and trace.total_memory == rec.total_memory
                and r.fallbacks == q.fallbacks
                and r.ops == q.ops
                and r.sizes == q.sizes
                and r.rids == q.rids
                and r.streams == q.streams
            )
            self._alias[id(trace)] = (trace, rec if same else trace)
        return self._alias[id(trace)][1]

    def prefetch(self, trace: Trace, conf: str) -> None:
        """Start the uncapped replay and min budget of `trace` under `conf` (in the background thread when
        there is one; else they are made now)."""
        trace = self._as_recording(trace)
        key = (id(trace), conf)
        if key in self._budgets and key in self._runs:
            return
        run: Future[SimResult] = Future()
        budget: Future[int | None] = Future()
        self._runs[key], self._budgets[key] = (trace, run), (trace, budget)
        if self._pool is not None:
            self._pool.submit(self._make, trace, conf, run, budget)
        else:
            self._make(trace, conf, run, budget)

    def _make(self, trace: Trace, conf: str, run: Future[SimResult], budget: Future[int | None]) -> None:
        try:
            made = uncapped_run(trace, conf, self.recording)
        except BaseException as exc:  # noqa: B036 - handed to whoever asks for it, as the call would raise it
            run.set_exception(exc)
            budget.set_exception(exc)
            return
        run.set_result(made)
        try:
            budget.set_result(min_budget(trace, conf, self.recording, made))
        except BaseException as exc:  # noqa: B036 - as above
            budget.set_exception(exc)

    def run(self, trace: Trace, conf: str) -> SimResult:
        """`uncapped_run(trace, conf, recording)`, made once."""
        self.prefetch(trace, conf)
        return self._runs[(id(self._as_recording(trace)), conf)][1].result()

    def min_budget(self, trace: Trace, conf: str) -> int | None:
        """`min_budget(trace, conf, recording, self.run(trace, conf))`, made once."""
        self.prefetch(trace, conf)
        return self._budgets[(id(self._as_recording(trace)), conf)][1].result()

    def low_end(self, trace: Trace) -> Trace | None:
        """`low_end(trace)`, made once per recording."""
        if id(trace) not in self._low_ends:
            self._low_ends[id(trace)] = (trace, low_end(trace))
        return self._low_ends[id(trace)][1]

    def release(self, trace: Trace, conf: str) -> None:
        """Let the replay of `trace` under `conf` go (the recording's own stays: every remedy compares with it)."""
        trace = self._as_recording(trace)
        if trace is not self.recording:
            self._runs.pop((id(trace), conf), None)


def simulated(
    name: str,
    what: str,
    t: Trace,
    conf: str,
    reference: Trace,
    base: int | None,
    base_activity: tuple[int, int, int, int],
    how_to: str,
    *,
    uncapped: "SimResult | None" = None,
    shared: Shared | None = None,
    **extra: Any,
) -> Remedy:
    """A remedy whose rewritten recording is `t`: its min budget (and, where workspaces no evidence
    covers could be given up, the low end of its range as `bound`), peaks and added driver work, all
    from one uncapped replay of `t` (`uncapped`: `uncapped_run` of `t`, when the caller has it;
    `shared`: where the replays of `t` may have been made already, `reference` its recording)."""
    if shared is not None:
        shared.prefetch(t, conf)  # (in the background: meanwhile this thread scans for the low end)
        if "bound" not in extra:
            shared.low_end(t)
        run = uncapped if uncapped is not None else shared.run(t, conf)
        mb = shared.min_budget(t, conf)
    else:
        run = uncapped if uncapped is not None else uncapped_run(t, conf, reference)
        mb = min_budget(t, conf, reference, run)
    peak, peak_alloc, calls, mib = activity_of(run)
    extra_calls = max(0, calls - base_activity[2])
    seconds = extra_calls * DRIVER_CALL_S + max(0, mib - base_activity[3]) * DRIVER_MIB_S
    if "bound" not in extra:
        extra["bound"] = workspace_floor(t, conf, reference, mb, run, shared.low_end if shared else low_end)
    if shared is not None:
        shared.release(t, conf)
    return Remedy(
        name,
        what,
        mb,
        None if mb is None or base is None else base - mb,
        peak,
        peak_alloc,
        extra_calls,
        seconds,
        how_to,
        SIMULATED,
        conf,
        trace=t,
        **extra,
    )
