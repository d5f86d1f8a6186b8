"""`tune(...)`: the whole tune as one call — settings checked, store opened, trials run, answer.

Why here and not in the CLI: the command only parses, calls this and renders (issue #20),
and the Python API (`alloctune.tune.session.tune`) is the same function. The trials run
through the runner (fresh processes with the agent inside) unless the caller passes its own
evaluator or executor; the runner is imported only when needed, so the module stays
importable without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from alloctune.errors import InputError
from alloctune.progress import Progress, no_progress
from alloctune.tune.executors.base import Evaluator, Executor
from alloctune.tune.rank_sim import simulator_for
from alloctune.tune.recommend import Recommendation, recommend
from alloctune.tune.simulator import SimulatorFromTrace
from alloctune.tune.strategy import TrialRecord, Tuner, TuneResult, TuneSettings


def default_store(command: Sequence[str], budget: int | None) -> Path:
    """~/.cache/alloctune/tune/<hash of command and budget>/trials.jsonl (so --resume finds it)."""
    key = hashlib.sha256(json.dumps([list(command), budget]).encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "alloctune" / "tune" / key / "trials.jsonl"


@dataclass
class TuneSession:
    """A prepared tune: run it with `run()`; `tuner.trials` holds every trial so far, also after
    an error or Ctrl-C (the CLI shows them)."""

    settings: TuneSettings
    store_path: Path
    tuner: Tuner
    moved_previous: Path | None = None  # an earlier sweep of the same command, kept aside
    skipped_lines: int = 0  # unreadable store lines (a trial cut off by a kill) on --resume
    store_warnings: tuple[str, ...] = ()  # one per skipped store line, naming it
    started: float = field(default_factory=time.monotonic)

    def run(self) -> "TuneOutcome":
        self.started = time.monotonic()
        try:
            result = self.tuner.run()
        finally:
            getattr(self.tuner.executor, "close", lambda: None)()  # a Ray executor holds a cluster connection
        return TuneOutcome(result, recommend(result), self.store_path, round(time.monotonic() - self.started, 1))


@dataclass(frozen=True)
class TuneOutcome:
    result: TuneResult
    recommendation: Recommendation
    store: Path
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        data = self.result.to_dict()
        data["recommendation"] = self.recommendation.to_dict()
        data["store"] = str(self.store)
        data["elapsed_s"] = self.elapsed_s
        return data


def prepare(
    command: Sequence[str],
    *,
    budget: int | None = None,
    knobs: Sequence[str] | None = None,
    strategy: str = "confirm",
    platform: str | None = None,
    store: str | Path | None = None,
    resume: bool = False,
    simulate_first: bool = False,
    repeat: int = 1,
    timeout: float | None = None,
    max_gpu_runs: int = 10,
    throughput: str = "auto",
    remedies: bool = True,
    evaluator: Evaluator | None = None,
    executor: Executor | None = None,
    executor_name: str | None = None,
    jobs: int | None = None,
    address: str | None = None,
    on_trial_start: Callable[[str, int | None, str], None] | None = None,
    on_trial_end: Callable[[TrialRecord], None] | None = None,
    progress: Progress = no_progress,
) -> TuneSession:
    """Check the inputs (one-line errors), open the store and build the tuner; nothing runs yet."""
    from alloctune.tune.candidates import parse_knobs
    from alloctune.tune.platform import check_platform
    from alloctune.tune.store import TrialStore

    injected = evaluator is not None  # tests and API users that bring their own runs
    if evaluator is None:
        from alloctune.run.runner import resolve_command

        resolve_command(command)  # a missing command is an error before anything is created
    if budget is not None and budget <= 0:
        raise InputError("--budget must be more than 0 bytes")
    if timeout is not None and timeout <= 0:
        raise InputError("--timeout must be a positive number of seconds")
    if max_gpu_runs < 2:
        raise InputError("--max-gpu-runs must be at least 2 (a pass and a failure prove a min_budget)")
    settings = TuneSettings(
        command=tuple(command),
        budget=budget,
        knobs=parse_knobs(list(knobs) if knobs else None),
        strategy=strategy,
        simulate_first=simulate_first,
        repeat=repeat,
        platform=check_platform(platform),
        max_gpu_runs=max_gpu_runs,
        throughput_check=throughput,
        remedies=remedies,
    )
    path = Path(store) if store is not None else default_store(command, budget)
    # Locked before anything is moved or run: a second tune on this store is a one-line error.
    trial_store = TrialStore(path, list(command), resume=resume, rotate=store is None)
    moved = trial_store.rotated_to
    recorded = None
    if evaluator is None:
        from alloctune.run.runner import TrialEvaluator
        from alloctune.trace import prefetch_trace

        if settings.strategy == "confirm" or settings.simulate_first:
            recorded = prefetch_trace  # loaded while its run still exits: the next runs wait for its simulation
        evaluator = TrialEvaluator(list(command), path.with_suffix(".d"), timeout=timeout, on_recorded=recorded)
    if executor is None and (executor_name is not None or jobs is not None or address is not None):
        # scale's executors (side by side on this GPU, one per GPU, Ray)
        from alloctune.tune.executors.factory import executor_for_sweep

        executor = executor_for_sweep(
            executor_name or "local",
            command,
            path.with_suffix(".d"),
            jobs=jobs,
            address=address,
            budget=budget,
            timeout=timeout,
            live=False,
            on_recorded=recorded,
        )
    elif executor is None and settings.strategy == "confirm" and not injected:
        executor = side_by_side(command, path.with_suffix(".d"), timeout, recorded)
    tuner = Tuner(
        evaluator,
        settings,
        store=trial_store,
        simulator_factory=lambda baseline: simulator_for(baseline, lambda b: SimulatorFromTrace(b, progress=progress)),
        on_trial_start=on_trial_start,
        on_trial_end=on_trial_end,
        executor=executor,
    )
    if getattr(executor, "side_by_side", False):  # a port the user pinned would be shared by parallel trials
        from alloctune.run.ports import shared_port_note

        note = shared_port_note(command, os.environ)
        if note:
            tuner.notes.append(note)
    return TuneSession(settings, path, tuner, moved, trial_store.skipped_lines if resume else 0, tuple(trial_store.warnings))


CONFIRM_JOBS = 4  # the confirm flow's batches hold 2-4 runs


def side_by_side(
    command: Sequence[str], workdir: Path, timeout: float | None, on_recorded: Callable[[Path], None] | None = None
) -> Executor | None:
    """The confirm flow's default: its memory runs side by side on this GPU (each is capped, and
    the pool admits one only while the caps plus CUDA contexts fit in free memory; runs that
    sample throughput still have the GPU alone). None, so one run after another, when NVML
    cannot read the free memory or the machine has one core."""
    from alloctune.tune.executors.gpuinfo import probe

    gpus = probe()
    jobs = min(CONFIRM_JOBS, os.cpu_count() or 1)
    if not gpus or gpus[0].free is None or jobs < 2:
        return None
    from alloctune.tune.executors.factory import executor_for_sweep
    from alloctune.tune.executors.local import usable_memory

    # the free memory just read is handed over: the executor need not ask NVML again
    return executor_for_sweep(
        "local",
        command,
        workdir,
        jobs=jobs,
        timeout=timeout,
        live=False,
        memory=usable_memory(gpus[0].free),
        on_recorded=on_recorded,
    )


def tune(command: Sequence[str], **options: Any) -> TuneOutcome:
    """The Python API: `tune(["python", "infer.py"], budget=6 << 30)` → `TuneOutcome` (see `prepare`)."""
    return prepare(command, **options).run()
