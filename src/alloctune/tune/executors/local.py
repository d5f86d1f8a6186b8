"""`--executor local`: trials side by side on one GPU, as many as its free memory holds.

A budget trial only ever uses its cap plus its CUDA context, so on an H200 with 140 GB free
a sweep at a 20 GiB budget can run six trials at once instead of one. `jobs=1` is today's
sequential behaviour. Without NVML (or with `memory` unknown) it runs one trial at a time:
packing blind could push two trials into each other's memory and change their outcome.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from alloctune.errors import InputError
from alloctune.progress import TrialProgress
from alloctune.tune.executors.base import close_ahead, start_ahead
from alloctune.tune.executors.gpuinfo import probe
from alloctune.tune.executors.pool import PoolExecutor, Slot
from alloctune.tune.executors.tasks import DEFAULT_CONTEXT_BYTES

# Left free beside the trials: NVML's "free" moves with other processes, and the driver
# needs some headroom of its own.
SAFETY_FRACTION = 0.02
AHEAD = 2  # runs started beside the recording: the confirm flow's opening pair


def usable_memory(free: int | None) -> int | None:
    return None if free is None else int(free * (1 - SAFETY_FRACTION))


def default_jobs(memory: int | None, budget_hint: int | None, context_bytes: int, cpus: int | None = None) -> int:
    """How many trials at once by default: as many as fit at `budget_hint`, at most one per CPU core.

    Each trial is a whole workload process (data loading, Python overhead), so more trials
    than cores would slow all of them and skew throughput.
    """
    if memory is None or budget_hint is None:
        return 1
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return max(1, min(cpus, memory // (budget_hint + context_bytes)))


class LocalExecutor(PoolExecutor):
    """Parallel budget trials on the first visible GPU (see the module doc)."""

    def __init__(
        self,
        runner: Any,
        *,
        jobs: int | None = None,
        memory: int | None = None,
        budget_hint: int | None = None,
        context_bytes: int = DEFAULT_CONTEXT_BYTES,
        timeout: float | None = None,
        first_number: int = 0,
        progress: TrialProgress | None = None,
        command: Sequence[str] = (),
        processes: int = 1,
    ):
        if jobs is not None and jobs < 1:
            raise InputError(f"--jobs must be at least 1, got {jobs}")
        if memory is None:
            gpus = probe()
            memory = usable_memory(gpus[0].free) if gpus else None
        if jobs is None:
            per = None if budget_hint is None else max(1, processes) * (budget_hint + context_bytes) - context_bytes
            jobs = default_jobs(memory, per, context_bytes)
        if jobs > 1 and memory is None:
            raise InputError(
                "--jobs > 1 needs the GPU's free memory (NVML: pip install nvidia-ml-py), or give the memory trials may share"
            )
        super().__init__(
            runner,
            [Slot("gpu", (), memory, jobs)],
            context_bytes=context_bytes,
            timeout=timeout,
            first_number=first_number,
            progress=progress,
            command=command,
            processes=processes,
        )
        self.jobs = jobs
        self.memory = memory

    def start_ahead(self) -> None:
        """The confirm flow's opening runs start beside the recording (`run.warm`), as many as run at once."""
        start_ahead(self.runner, min(AHEAD, self.jobs))

    def close_ahead(self) -> str | None:
        return close_ahead(self.runner)
