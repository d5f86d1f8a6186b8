"""The built-in demo: what alloctune tells an RVC user, from a real trace, on any CPU.

It replays a shipped allocator trace (recorded on an H200 from an RVC v2 inference run with
chunks of 7-72 s) under the standard candidate settings, finds each one's smallest working
budget and the smallest common card it fits on, and shows what the folklore values of
`max_split_size_mb` would do. Everything is simulated, so it runs in seconds without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from alloctune.config.standard import STANDARD_CONFS
from alloctune.sim.resolution import ABS_TOL, step
from alloctune.units import GiB, MiB, format_size

# Values copied from forum threads for RVC and Stable Diffusion.
FOLKLORE_CANDIDATES: tuple[str, ...] = (
    "max_split_size_mb:4120",
    "max_split_size_mb:5120",
    "max_split_size_mb:6120",
)
# Common consumer/workstation card sizes, in GiB as the driver reports them (roughly).
CARD_SIZES_GIB: tuple[int, ...] = (2, 3, 4, 6, 8, 10, 12, 16, 24)
DEFAULT_TRACE = "rvc_h200_ec1"
# A 6 GiB card leaves roughly this much to PyTorch once the CUDA context is loaded.
GPU_DEMO_BUDGET = "5.5GiB"
GPU_DEMO_FILES = 4  # audio files per trial: enough lengths to fragment, short enough for a demo


def cuda_available() -> bool:
    """True only when torch is installed and sees a CUDA device.

    Asked in a child so this process never imports torch (the core stays pure Python), and
    so a `--gpu` wish is checked against the machine before anything says "GPU found"."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("torch") is None:
        return False
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
            capture_output=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):  # a hung driver is no GPU for the demo
        return False
    return probe.returncode == 0


def gpu_demo_command(json_out: bool = False, budget: int | None = None) -> list[str]:
    """`alloctune tune` on the RVC workload under `budget` (bytes; default a 6 GiB card's budget):
    the default confirm flow (the simulator ranks every candidate from the baseline's trace, the
    GPU confirms the best)."""
    import sys

    return [
        sys.executable,
        "-m",
        "alloctune",
        "tune",
        "--budget",
        demo_budget_arg(budget),
        *(["--json"] if json_out else []),
        "--",
        sys.executable,
        "-m",
        "alloctune.workloads.rvc",
        "--device",
        "cuda",
        "--count",
        str(GPU_DEMO_FILES),
    ]


def demo_budget_arg(budget: int | None) -> str:
    """The `--budget` value the demo's GPU run and its closing hint use: the budget given (spelled so
    that it reads back to the same bytes), else a 6 GiB card's."""
    from alloctune.units import format_size_arg

    return format_size_arg(budget) if budget is not None else GPU_DEMO_BUDGET


def shipped_traces() -> list[str]:
    """File names of the traces inside the package (`alloctune/data/traces`, with `.atrace`)."""
    from alloctune.trace.shipped import SUFFIX, shipped_names

    return [name + SUFFIX for name in shipped_names()]


def shipped_trace_info() -> list[dict[str, str]]:
    """One row per shipped trace: name, workload, allocator setting it was recorded under, torch, how."""
    from alloctune.trace.compact import read_compact_header
    from alloctune.trace.shipped import shipped_names

    rows = []
    for name in shipped_names():
        head = read_compact_header(shipped_trace_path(name))
        meta = head.get("meta") or {}
        settings = head.get("allocator_settings") or {}
        conf = meta.get("conf") or settings.get("PYTORCH_CUDA_ALLOC_CONF") or ""
        rows.append(
            {
                "name": name,
                "workload": str(meta.get("workload", "")),
                "setting": conf or "(default)",
                "torch": str(meta.get("torch", "")),
                "recorded_by": str(meta.get("recorded_by", "")),
            }
        )
    return rows


def shipped_trace_list() -> dict[str, Any]:
    """What `demo --list --json` prints: the rows of `shipped_trace_info` under a schema."""
    from alloctune.schema import with_schema

    return with_schema("demo.list", {"traces": shipped_trace_info()})


def shipped_trace_path(name: str = DEFAULT_TRACE) -> Path:
    """The file of a shipped trace: its name with or without `.atrace`, or a workload name only
    one shipped trace carries (`rvc_ec1`); an `InputError` listing the names otherwise."""
    from alloctune.errors import InputError
    from alloctune.trace.shipped import shipped_names, shipped_path

    path = shipped_path(name)
    if path is None or not path.is_file():
        raise InputError(
            f"no shipped trace named {name!r}; available: {', '.join(shipped_names()) or 'none'} (or give a trace file)"
        )
    return path


@dataclass(frozen=True)
class DemoRow:
    """One setting's simulated outcome on the demo trace."""

    conf: str
    peak_reserved: int
    peak_allocated: int
    utilization: float
    retries: int
    min_budget: int | None  # smallest per-process cap that completes (bytes)
    smallest_card_gib: int | None  # smallest card in CARD_SIZES_GIB the run fits on
    fits_budget: bool | None  # completes under the demo's budget (None: no budget given)
    # same simulated segments, peaks, retries and budgets as the default: the setting changes nothing here
    no_effect: bool = False

    @property
    def label(self) -> str:
        return self.conf or "(default)"

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "label": self.label}


@dataclass(frozen=True)
class DemoResult:
    """What the simulated demo found on one trace.

    Attributes:
        trace: the trace file's path.
        workload: the workload its metadata names ("rvc_ec1", "llm (alloctune.workloads.llm, 6 items)").
        requests: allocator requests replayed.
        budget: the budget each row is checked against (bytes), None when none was given.
        rows / folklore: the standard settings' and the forum values' outcomes.
        recommended: the best of `rows`.
        notes: sentences that explain the table.
        recorded_with: torch version of the recording, when its metadata says.
        name: what to pass to `demo --trace` (or any command) for this trace again: a shipped
            trace's name, else the path as given.
    """

    trace: str
    workload: str
    requests: int
    budget: int | None
    rows: tuple[DemoRow, ...]
    folklore: tuple[DemoRow, ...]
    recommended: DemoRow
    notes: tuple[str, ...] = field(default=())
    recorded_with: str = ""
    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "alloctune.demo/1",
            "trace": self.trace,
            "name": self.name or self.trace,
            "workload": self.workload,
            "requests": self.requests,
            "budget": self.budget,
            "rows": [r.to_dict() for r in self.rows],
            "folklore": [r.to_dict() for r in self.folklore],
            "recommended": self.recommended.to_dict(),
            "notes": list(self.notes),
            "recorded_with": self.recorded_with,
        }


def _smallest_card(trace, config, fits_at_least: int | None) -> int | None:
    """Smallest card (GiB) on which the run completes, simulating the card's own total memory
    (which includes the CUDA context's share, unlike a per-process cap)."""
    from alloctune.sim import replay

    for gib in CARD_SIZES_GIB:
        if fits_at_least is not None and gib * GiB < fits_at_least:
            continue
        r = replay(trace, config, total_memory=gib * GiB, record_events=False, timeline_points=1)
        if r.completed:
            return gib
    return None


def demo_row(trace, row) -> DemoRow:
    """A demo row from the sweep service's row, plus the smallest common card it fits on."""
    from alloctune.config import AllocatorConfig

    return DemoRow(
        conf=row.conf,
        peak_reserved=row.peak_reserved,
        peak_allocated=row.peak_allocated,
        utilization=row.utilization,
        retries=row.retries,
        min_budget=row.min_budget,
        smallest_card_gib=_smallest_card(trace, AllocatorConfig.parse(row.conf), row.min_budget),
        fits_budget=row.at_budget,
    )


def _rank_key(row: DemoRow, tolerance: int) -> tuple:
    # Lowest working budget first, but budgets within the bisection's resolution are a tie;
    # then the lower uncapped peak (less memory held for everything else on the card);
    # then fewer retries (each is a full cache flush: a stall, so lower throughput);
    # then, when none of that tells them apart, simply the smaller budget; then the simpler string.
    budget = row.min_budget if row.min_budget is not None else 1 << 62
    return (budget // max(tolerance, 1), row.peak_reserved, row.retries, budget, len(row.conf))


def _outcome(row: DemoRow) -> tuple:
    return (row.peak_reserved, row.peak_allocated, row.retries, row.min_budget, row.smallest_card_gib)


def _segment_events(trace, conf: str) -> tuple:
    """The uncapped run's segment events in order: equal events and peaks mean the allocator
    asked the driver for exactly the same memory, so the setting never changed a decision."""
    from alloctune.config import AllocatorConfig
    from alloctune.sim import replay

    r = replay(trace, AllocatorConfig.parse(conf), record_events=True, timeline_points=1)
    return tuple((e.action, e.addr, e.size) for e in r.segment_events)


def mark_no_effect(trace, default: DemoRow, rows: tuple[DemoRow, ...]) -> tuple[DemoRow, ...]:
    """`rows` with `no_effect` set where a row's outcome and segment events equal the default's.

    Only rows whose numbers already match pay the extra replay (the events are the proof: equal
    numbers alone could hide different segments)."""
    same = [r for r in rows if r.conf and _outcome(r) == _outcome(default)]
    if not same:
        return rows
    reference = _segment_events(trace, default.conf)
    effectless = {r.conf for r in same if _segment_events(trace, r.conf) == reference}
    return tuple(replace(r, no_effect=True) if r.conf in effectless else r for r in rows)


def why_not_smaller(best: DemoRow, rows: tuple[DemoRow, ...], tolerance: int) -> str | None:
    """Why `best` is recommended over a row that needs a smaller budget (None when none does).

    The ranking treats budgets within the bisection's resolution as equal and then prefers the
    lower uncapped peak, then fewer retries; this says which of those decided."""
    if not best.min_budget:
        return None
    cheaper = [r for r in rows if r.min_budget and r.min_budget < best.min_budget]
    if not cheaper:
        return None
    alt = min(cheaper, key=lambda r: r.min_budget)
    if best.peak_reserved < alt.peak_reserved:
        reason = (
            f"without a cap it holds {format_size(alt.peak_reserved - best.peak_reserved)} less "
            f"({format_size(best.peak_reserved)} vs {format_size(alt.peak_reserved)}), left to the rest of the card"
        )
    else:  # the rank key only lets a larger budget win on the peak or on retries
        reason = (
            f"it needs {alt.retries - best.retries} fewer allocator retries without a cap "
            "(each flushes the cache and stalls the run)"
        )
    return (
        f"{best.label} is recommended over {alt.label}, which needs "
        f"{format_size(best.min_budget - alt.min_budget)} less ({format_size(alt.min_budget)}): "
        f"that is within the simulator's resolution ({format_size(tolerance)}), and {reason}."
    )


def run_demo(trace_path: str | Path | None = None, budget: int | None = None) -> DemoResult:
    """Simulate the standard and folklore settings on a trace and pick the best setting."""
    from alloctune.trace import load_trace
    from alloctune.trace.shipped import SUFFIX, is_shipped

    if trace_path is None:
        path = shipped_trace_path()
    elif Path(trace_path).exists():
        path = Path(trace_path)  # the loader says what is wrong with it, if anything
    else:  # a shipped trace by name, with or without the suffix, or by its unique workload name
        path = shipped_trace_path(str(trace_path))
    name = path.name.removesuffix(SUFFIX) if is_shipped(path) else str(trace_path)
    from alloctune.sim.sweep import sweep

    trace = load_trace(path)
    result = sweep(trace, STANDARD_CONFS + FOLKLORE_CANDIDATES, budget=budget)
    every = tuple(demo_row(trace, r) for r in result.rows)
    every = mark_no_effect(trace, every[0], every)
    rows, folklore = tuple(every[: len(STANDARD_CONFS)]), tuple(every[len(STANDARD_CONFS) :])
    found = [r.min_budget for r in rows if r.min_budget]
    tolerance = step(min(found)) if found else ABS_TOL  # the bisection's resolution
    best = min(rows, key=lambda r: _rank_key(r, tolerance))
    default = rows[0]
    notes: list[str] = []
    segs = [e.size for e in trace.segment_events if e.action == "segment_alloc"]
    if segs:
        biggest = max(segs)
        noop = [r.conf.partition(":")[2] for r in folklore if int(r.conf.partition(":")[2]) * MiB > biggest]
        if noop:
            notes.append(
                f"max_split_size_mb {', '.join(noop)} (folklore): larger than every segment this run ever made "
                f"({format_size(biggest)}), so no block is ever 'oversize' and nothing changes."
            )
    same = [r.conf for r in rows if r.no_effect]
    if same:
        splits = [c.partition(":")[2] for c in same if c.startswith("max_split_size_mb:") and "," not in c]
        because = (
            f"; no segment it made reaches {min(map(int, splits))} MiB, so the split rule never applies"
            if segs and len(splits) == len(same)
            else ""
        )
        notes.append(f"{', '.join(same)}: no effect on this run (the same segments, peaks and budgets as the default){because}.")
    if default.min_budget and best.min_budget and best is not default:
        saved = 1 - best.min_budget / default.min_budget
        notes.append(f"{best.label} lowers the smallest working budget by {saved:.0%} against the default.")
    why = why_not_smaller(best, rows, tolerance)
    if why:
        notes.append(why)
    if result.untagged_note:
        notes.append(result.untagged_note)
    if best.conf.startswith("expandable_segments"):
        others = [r for r in rows if not r.conf.startswith("expandable_segments")]
        alt = min(others, key=lambda r: _rank_key(r, tolerance))
        if alt.conf:
            notes.append(
                f"expandable_segments is not available on Windows; there, {alt.label} is the best of the rest"
                + (f" ({alt.min_budget / default.min_budget - 1:+.0%})." if alt.min_budget and default.min_budget else ".")
            )
    return DemoResult(
        trace=str(path),
        workload=str(trace.meta.get("workload", "unknown")),
        requests=len(trace.requests),
        budget=budget,
        rows=rows,
        folklore=folklore,
        recommended=best,
        notes=tuple(notes),
        recorded_with=str(trace.meta.get("torch") or ""),
        name=name,
    )
