"""One trial as plain data: what the sweep asks for (`TrialRequest`) and the evidence `runner`
produces and `tune` consumes (`TrialResult`).

It lives apart from `runner` so that the pure core (`tune`, `report`, the store, a remedy's
confirming run in `remedy.measured`) can read and write trials without importing the module that
starts processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from alloctune.errors import EnvironmentProblem, InputError
from alloctune.units import format_size, utilization

RESULT_SCHEMA = 1
OUTCOMES = ("ok", "oom", "crash", "timeout", "no-cuda", "budget-too-large")


def remedy_switches(no_grad: bool = False, cudnn_benchmark: bool | None = None, checkpointing: bool = False) -> dict[str, Any]:
    """The remedy switches that are set, by name; unset ones are absent, so the agent's settings, the
    evaluator's keywords and the store's trial keys of runs without them stay as they were."""
    out: dict[str, Any] = {}
    if no_grad:
        out["no_grad"] = True
    if cudnn_benchmark is not None:
        out["cudnn_benchmark"] = bool(cudnn_benchmark)
    if checkpointing:
        out["checkpointing"] = True
    return out


@dataclass(frozen=True)
class TrialRequest:
    """One trial the sweep wants: the workload under `conf` with a per-process cap of `budget` bytes."""

    conf: str
    budget: int | None  # bytes; None = the whole card
    repeat: int = 0
    record: bool = False  # keep the allocator history (the baseline)
    ensure_cap: bool = False  # apply the cap even when it is >= the card (so it is read back)
    exclusive: bool = False  # needs the GPU to itself: its throughput will be compared
    purpose: str = ""
    no_grad: bool = False  # the agent runs the program with autograd off (a remedy's confirming run)
    cudnn_benchmark: bool | None = None  # the agent sets cudnn.benchmark to it (a remedy's confirming run)
    checkpointing: bool = False  # the agent switches activation checkpointing on (a remedy's confirming run)

    @property
    def remedy(self) -> bool:
        """A remedy's confirming run: it says nothing about its setting's bracket."""
        return self.no_grad or self.cudnn_benchmark is not None or self.checkpointing

    def call_options(self) -> dict[str, Any]:
        """The evaluator's keyword arguments; the remedy switches only when set, so evaluators that
        never confirm a remedy need not take them."""
        return dict(
            repeat=self.repeat,
            record=self.record,
            ensure_cap=self.ensure_cap,
            **remedy_switches(self.no_grad, self.cudnn_benchmark, self.checkpointing),
        )


@dataclass(frozen=True)
class TrialResult:
    """Evidence of one trial, as shown in tables and kept in the tune store."""

    command: tuple[str, ...]
    conf: str | None  # allocator string as applied; None = inherited from the caller's environment
    budget: int | None  # per-process cap in bytes; None = the whole card
    outcome: str
    exit_code: int | None
    wall_s: float
    peak_reserved: int | None = None
    peak_allocated: int | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None
    allocator_settings: dict[str, Any] | None = None
    oom_message: str | None = None
    error: str | None = None  # why it crashed (exception or output tail), or why no CUDA
    throughput: float | None = None
    throughput_unit: str | None = None
    total_memory: int | None = None
    device_name: str | None = None
    torch_version: str | None = None
    snapshot: str | None = None
    oom_snapshot: str | None = None
    segment_sizes: tuple[tuple[int, int], ...] | None = None
    stats: dict[str, int] = field(default_factory=dict)
    processes: int = 0
    warnings: tuple[str, ...] = ()
    repeat: int = 0
    log: str | None = None
    ranks: tuple[dict[str, Any], ...] = ()  # multi-process jobs: one `ranks.RankSummary.to_dict()` per rank
    # Recorded runs: module calls made with / without autograd and backward passes (the busiest process's).
    autograd: dict[str, int] | None = None
    no_grad: bool = False  # the agent ran the program with autograd off (opt-in)
    # torch.backends.cudnn.benchmark as the program left it (None: unknown), and what the agent set it to
    # at torch import (None: left alone; a remedy's confirming run)
    cudnn_benchmark: bool | None = None
    cudnn_benchmark_set: bool | None = None
    # What the agent's checkpointing switch turned on (None: not asked; empty: nothing it could checkpoint)
    checkpointing: tuple[str, ...] | None = None
    # Started ahead (run/warm.py): seconds its process had run, held at its first CUDA call, before this
    # trial was given to it; `wall_s` then counts from there. None: started cold.
    started_ahead_s: float | None = None

    @property
    def inference_with_grad(self) -> bool:
        """Modules were called with autograd on, yet nothing ever ran backward: activations kept for nothing."""
        a = self.autograd or {}
        return a.get("module_calls_with_grad", 0) > 0 and a.get("backward_calls", 0) == 0

    @property
    def passed(self) -> bool:
        return self.outcome == "ok"

    @property
    def utilization(self) -> float | None:
        """peak allocated ÷ peak reserved (`units.utilization`)."""
        return utilization(self.peak_allocated, self.peak_reserved)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["command"] = list(self.command)
        data["segment_sizes"] = [list(p) for p in self.segment_sizes] if self.segment_sizes is not None else None
        data["warnings"] = list(self.warnings)
        data["ranks"] = [dict(r) for r in self.ranks]
        data["utilization"] = self.utilization
        data["inference_with_grad"] = self.inference_with_grad
        data["schema"] = RESULT_SCHEMA
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrialResult":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in names}
        kw["command"] = tuple(kw.get("command") or ())
        if kw.get("segment_sizes") is not None:
            kw["segment_sizes"] = tuple((int(s), int(c)) for s, c in kw["segment_sizes"])
        kw["warnings"] = tuple(kw.get("warnings") or ())
        kw["stats"] = dict(kw.get("stats") or {})
        kw["ranks"] = tuple(dict(r) for r in kw.get("ranks") or ())
        return cls(**kw)


def raise_for_environment(result: TrialResult) -> None:
    """Turn the outcomes that are the user's setup, not the workload, into one-line errors."""
    if result.outcome == "budget-too-large":
        total = f" ({format_size(result.total_memory)})" if result.total_memory else ""
        raise InputError(
            f"budget {format_size(result.budget or 0)} is larger than the card{total}"
            f"{' ' + result.device_name if result.device_name else ''}: give a --budget below its total memory"
        )
    if result.outcome == "no-cuda":
        raise EnvironmentProblem(f"no CUDA in the command: {result.error}; nothing to measure")


def trial_json(result: TrialResult) -> dict[str, Any]:
    """What `alloctune run --json` prints for a trial (and the MCP tool returns)."""
    from alloctune.schema import with_schema

    return with_schema("trial", result.to_dict())
