"""`--executor NAME` → an executor: the one place the CLI's options become an object."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

from alloctune.errors import InputError
from alloctune.progress import TrialProgress
from alloctune.tune.executors.base import Executor
from alloctune.tune.executors.tasks import DEFAULT_CONTEXT_BYTES

EXECUTORS = ("local", "gpus", "ray")
CONTEXT_ENV = "ALLOCTUNE_CUDA_CONTEXT"  # bytes (or 600MiB) a trial's CUDA context needs beside its cap


def context_bytes_from_env(env: dict[str, str] | None = None) -> int:
    value = (env if env is not None else os.environ).get(CONTEXT_ENV)
    if not value:
        return DEFAULT_CONTEXT_BYTES
    from alloctune.units import parse_size

    return parse_size(value)


def make_executor(
    name: str,
    runner: Any,
    *,
    jobs: int | None = None,
    address: str | None = None,
    budget_hint: int | None = None,
    gpus_per_trial: int = 1,
    timeout: float | None = None,
    first_number: int = 0,
    progress: TrialProgress | None = None,
    command: Sequence[str] = (),
    context_bytes: int | None = None,
    processes: int = 1,
    memory: int | None = None,
) -> Executor:
    """`runner`: a `SpecRunner` (needed by `ray`, which ships it to workers) or any evaluator;
    `memory`: for `local`, the bytes trials may share when the caller already read them (else NVML)."""
    ctx = context_bytes if context_bytes is not None else context_bytes_from_env()
    common = dict(
        timeout=timeout, first_number=first_number, progress=progress, command=command, context_bytes=ctx, processes=processes
    )
    if address is not None and name != "ray":
        raise InputError("--address is for --executor ray")
    if name == "local":
        from alloctune.tune.executors.local import LocalExecutor

        return LocalExecutor(runner, jobs=jobs, budget_hint=budget_hint, memory=memory, **common)
    if name == "gpus":
        from alloctune.tune.executors.gpus import GpusExecutor

        # one process per GPU when a trial gets a group of GPUs (torchrun with --nproc-per-node = the group)
        common["processes"] = max(1, processes // gpus_per_trial)
        return GpusExecutor(runner, gpus_per_trial=gpus_per_trial, jobs_per_gpu=jobs or 1, **common)
    if name == "ray":
        if jobs is not None:
            raise InputError("--jobs is for the local and gpus executors; Ray packs trials by GPU fraction")
        from alloctune.tune.executors.ray_tasks import RayExecutor

        if gpus_per_trial > 1:
            common["processes"] = max(1, processes // gpus_per_trial)
        return RayExecutor(runner, address=address, gpus_per_trial=gpus_per_trial, **common)
    raise InputError(f"--executor {name!r} is not known: use one of {', '.join(EXECUTORS)}")


def executor_for_sweep(
    name: str,
    command: Sequence[str],
    workdir: str | os.PathLike,
    *,
    jobs: int | None = None,
    address: str | None = None,
    budget: int | None = None,
    timeout: float | None = None,
    torch_version: str | None = None,
    processes: int = 1,
    gpus_per_trial: int = 1,
    live: bool = True,
    memory: int | None = None,
    on_recorded: Callable[[Path], None] | None = None,
) -> Executor:
    """What `alloctune tune --executor NAME [--jobs N] [--address A]` runs its trials on.

    Logs go to `workdir/logs/trial-NNNN.log`, numbered after the ones a resumed sweep left;
    the recorded baseline to `workdir/baseline.pickle`; `live` draws the progress table on stderr;
    `on_recorded(path)`: told of a recording made on this host as soon as it is whole.
    """
    from alloctune.tune.executors.spec import SpecRunner, TrialSpec

    spec = TrialSpec.make(command, workdir, torch_version=torch_version)
    progress = None
    if live:
        from alloctune.progress import LiveTrialTable

        progress = LiveTrialTable()
    return make_executor(
        name,
        SpecRunner(spec, on_recorded),
        jobs=jobs,
        address=address,
        budget_hint=budget,
        timeout=timeout,
        first_number=spec.first_free_number(),
        progress=progress,
        command=command,
        processes=processes,
        gpus_per_trial=gpus_per_trial,
        memory=memory,
    )
