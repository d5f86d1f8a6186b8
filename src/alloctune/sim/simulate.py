"""Simulate a recorded workload under other allocator settings: the `alloctune simulate` capability.

Why a module of its own: this is the orchestration a user means by "simulate" — which budget
applies (a capped recording is checked under its own cap), where segment addresses come
from, a fidelity check against a recording, the smallest budget — and it used to live in the
CLI, out of reach of the Python API. It returns plain data; the CLI only renders it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from alloctune.config.standard import setting_label
from alloctune.errors import InputError
from alloctune.progress import Progress, no_progress
from alloctune.schema import schema_id

if TYPE_CHECKING:
    from alloctune.sim.replay import SimResult
    from alloctune.sim.settings import SimSettings
    from alloctune.trace.model import Trace

# Spellings before the `trace|compared|model` vocabulary (#18.2): accepted for one release.
DEPRECATED_ADDRESSES = {"auto": "trace", "recorded": "compared (with --compare), else trace"}


@dataclass(frozen=True)
class SimulatedSetting:
    """One setting's replay: peaks, retries, the OOM (with PyTorch's message), optional extras."""

    conf: str
    budget: int | None
    peak_reserved: int
    peak_allocated: int
    utilization: float
    num_alloc_retries: int
    num_ooms: int
    completed: bool
    oom: dict[str, Any] | None
    expected_failures: int
    addresses: str  # the address source asked for: trace | compared | model (`sim.addresses`)
    addresses_from: str = ""  # what the replay used: "recorded:<file>" or "model"
    min_budget: int | None = None
    min_budget_replays: int | None = None
    fidelity: dict[str, Any] | None = None
    find_min: bool = False

    @property
    def exact(self) -> bool | None:
        """Fidelity verdict against the recording (None when nothing was compared)."""
        return None if self.fidelity is None else bool(self.fidelity["exact"])

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "conf": self.conf,
            "budget": self.budget,
            "peak_reserved": self.peak_reserved,
            "peak_allocated": self.peak_allocated,
            "utilization": self.utilization,
            "num_alloc_retries": self.num_alloc_retries,
            "num_ooms": self.num_ooms,
            "completed": self.completed,
            "oom": self.oom,
            "expected_failures": self.expected_failures,
            "addresses": self.addresses,
            "addresses_from": self.addresses_from,
        }
        if self.find_min:
            d["min_budget"] = self.min_budget
            d["min_budget_replays"] = self.min_budget_replays
        if self.fidelity is not None:
            d["fidelity"] = self.fidelity
        return d


@dataclass(frozen=True)
class Simulation:
    """Every setting's result for one trace. `failed`: a predicted OOM or a fidelity difference."""

    trace: str
    torch: str
    budget: int | None
    total_memory: int
    compared_with: str | None
    rows: tuple[SimulatedSetting, ...] = field(default_factory=tuple)
    notes: tuple[str, ...] = ()

    @property
    def predicted_oom(self) -> bool:
        return any(not r.completed for r in self.rows)

    @property
    def differs(self) -> bool:
        return any(r.exact is False for r in self.rows)

    @property
    def failed(self) -> bool:
        """What `alloctune simulate` exits 1 for."""
        return self.predicted_oom or self.differs

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": schema_id("simulate"),
            "trace": self.trace,
            "torch": self.torch,
            "budget": self.budget,
            "total_memory": self.total_memory,
            "compared_with": self.compared_with,
            "predicted_oom": self.predicted_oom,
            "differs": self.differs,
            "rows": [r.to_dict() for r in self.rows],
            "notes": list(self.notes),
        }


def simulate(
    trace: str | Path,
    confs: Sequence[str] = ("",),
    *,
    budget: int | str | None = None,
    total_memory: int | str | None = None,
    device: int | None = None,
    torch: str = "2.11",
    find_min: bool = False,
    compare: str | Path | None = None,
    addresses: str = "trace",
    progress: Progress = no_progress,
) -> Simulation:
    """Replay `trace` (a snapshot or compact trace file) under each of `confs`.

    `budget`/`total_memory`: bytes (int) or text with a unit ("6GiB"); the budget must be above 0
    and at most the device memory (the trace's device, else an H200's). `compare`: a recording
    to check each replay against event for event; a capped recording is replayed under its own
    cap unless `budget` is given. `addresses`: where new segments are placed
    (`alloctune.sim.addresses`) — `trace` (where the trace's own recording put them: a
    prediction), `compared` (where `compare`'s recording put them: a replay, it borrows from the
    answer), `model` (the driver model only); the old `auto`/`recorded` still work for one release
    with a note. `find_min`: also bisect each setting's smallest completing budget.
    """
    from alloctune.config import AllocatorConfig
    from alloctune.sim.driver import H200_TOTAL
    from alloctune.sim.settings import SimSettings
    from alloctune.trace.load import load_trace
    from alloctune.units import format_size, parse_user_size

    source, notes = _address_source(addresses, compare is not None)
    if device is not None and device < 0:
        raise InputError(f"--device must be 0 or more, got {device}")
    cap = parse_user_size(budget, "--budget") if budget is not None else None
    total = parse_user_size(total_memory, "--total-memory") if total_memory is not None else None
    settings = [SimSettings.from_config(AllocatorConfig.parse(text, torch), torch) for text in confs]  # fail fast

    progress(f"loading {trace}")
    loaded = load_trace(trace, device)
    recorded = None
    if compare is not None:
        progress(f"loading {compare}")
        recorded = load_trace(compare, device)
    if cap is None and recorded is not None and (recorded.meta or {}).get("cap"):
        cap = int(recorded.meta["cap"])  # check a capped recording under its own cap
    device_total = int(total or loaded.total_memory or H200_TOTAL)
    if cap is not None and cap > device_total:
        raise InputError(f"--budget {format_size(cap)} is more than the device's memory ({format_size(device_total)})")

    from alloctune.sim.addresses import TRACE
    from alloctune.sim.budget import min_budget
    from alloctune.sim.sweep import side_by_side, sweep_threads

    of = dict(zip(confs, settings))

    def one(text: str) -> SimulatedSetting:
        row, result = _replay_one(loaded, recorded, text, of[text], cap=cap, total=total, torch=torch, source=source)
        if find_min:
            # an uncapped replay with the trace's own addresses is the bisection's first probe: hand it over
            uncapped = result if cap is None and source == TRACE else None
            mb = min_budget(loaded, of[text], torch=torch, total_memory=total, uncapped=uncapped)
            row = replace(row, find_min=True, min_budget=mb.budget, min_budget_replays=mb.replays)
        return row

    rows = []
    per_setting = 2 if find_min else 1
    steps = len(confs) * per_setting
    # replays compared event for event keep their events: one at a time, as a comparison is Python work
    threads = 1 if recorded is not None else sweep_threads(len(confs), "trace")
    for i, text, row in side_by_side(one, confs, threads, loaded):
        progress(f"replaying {setting_label(text)}", i * per_setting, steps)
        rows.append(row())
        if find_min:
            progress(f"smallest budget of {setting_label(text)}: bisected", i * per_setting + 1, steps)
    progress("done", steps, steps)
    return Simulation(
        trace=str(trace),
        torch=torch,
        budget=cap,
        total_memory=device_total,
        compared_with=None if compare is None else str(compare),
        rows=tuple(rows),
        notes=notes,
    )


def _address_source(addresses: str, comparing: bool) -> tuple[str, tuple[str, ...]]:
    """The address source a caller asked for, mapping the deprecated spellings (with a note)."""
    from alloctune.sim.addresses import COMPARED, TRACE, check_source

    if addresses in DEPRECATED_ADDRESSES:
        source = TRACE if addresses == "auto" or not comparing else COMPARED
        note = f"--addresses {addresses} is deprecated and will be removed: use --addresses {source}"
        return source, (note,)
    try:
        source = check_source(addresses)
    except ValueError as exc:
        raise InputError(f"--addresses: {exc}") from None
    if source == COMPARED and not comparing:
        raise InputError("--addresses compared needs --compare RECORDING (the recording whose addresses to use)")
    return source, ()


def _replay_one(
    trace: Trace,
    recorded: Trace | None,
    text: str,
    settings: SimSettings,
    *,
    cap: int | None,
    total: int | None,
    torch: str,
    source: str,
) -> tuple[SimulatedSetting, SimResult]:
    """The row for one setting, and the `SimResult` it was read from."""
    from alloctune.sim.addresses import fidelity_kind, replay_addresses
    from alloctune.sim.compare import compare as compare_replay
    from alloctune.sim.oom import oom_message
    from alloctune.sim.replay import replay

    mode, reference = replay_addresses(source, trace, recorded)
    result = replay(
        trace,
        settings,
        budget=cap,
        total_memory=total,
        torch=torch,
        addresses=mode,
        reference=reference,
        record_events=recorded is not None,
        timeline_points=200,
    )
    oom = None
    if result.oom is not None:
        message = oom_message(result.oom, total_memory=result.total_memory, torch=torch)
        oom = {**result.oom.to_dict(), "message": message}
    fidelity = None
    if recorded is not None:
        fidelity = compare_replay(result, recorded, stream_trace=None if recorded is trace else trace).to_dict()
        fidelity["kind"] = fidelity_kind(source, trace, recorded)
    utilization = round(result.utilization, 4)
    row = SimulatedSetting(
        conf=text,
        budget=cap,
        peak_reserved=result.peak_reserved,
        peak_allocated=result.peak_allocated,
        utilization=utilization if math.isfinite(utilization) else 1.0,
        num_alloc_retries=result.num_alloc_retries,
        num_ooms=result.stats["num_ooms"],
        completed=result.completed,
        oom=oom,
        expected_failures=len(result.expected_failures),
        addresses=source,
        addresses_from=result.addresses,
        fidelity=fidelity,
    )
    return row, result
