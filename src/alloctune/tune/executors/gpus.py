"""`--executor gpus`: one trial per visible GPU, each pointed at its card with `CUDA_VISIBLE_DEVICES`.

The child then sees its GPU as device 0, so the agent caps and measures the right card
without knowing about the others. `gpus_per_trial` hands a multi-process workload
(`torchrun --nproc-per-node N`) a group of N cards; `jobs_per_gpu` > 1 also packs budget
trials side by side on each card, as the local executor does on one.
"""

from __future__ import annotations

from typing import Any, Sequence

from alloctune.errors import EnvironmentProblem, InputError
from alloctune.progress import TrialProgress
from alloctune.tune.executors.gpuinfo import GpuInfo, probe
from alloctune.tune.executors.local import usable_memory
from alloctune.tune.executors.pool import PoolExecutor, Slot
from alloctune.tune.executors.tasks import DEFAULT_CONTEXT_BYTES


def gpu_slots(gpus: Sequence[GpuInfo], *, gpus_per_trial: int = 1, jobs_per_gpu: int = 1) -> list[Slot]:
    """Slots of `gpus_per_trial` consecutive visible GPUs each (a leftover GPU stays unused)."""
    if gpus_per_trial < 1 or jobs_per_gpu < 1:
        raise InputError("--gpus-per-trial and --jobs must be at least 1")
    if len(gpus) < gpus_per_trial:
        raise EnvironmentProblem(f"a trial needs {gpus_per_trial} GPU(s); {len(gpus)} visible")
    slots = []
    for i in range(0, len(gpus) - gpus_per_trial + 1, gpus_per_trial):
        group = gpus[i : i + gpus_per_trial]
        frees = [usable_memory(g.free) for g in group]
        memory = None if any(f is None for f in frees) else min(frees)  # every rank gets the same cap
        ids = ",".join(g.visible_id for g in group)
        slots.append(Slot(f"gpu{ids}", (("CUDA_VISIBLE_DEVICES", ids),), memory, jobs_per_gpu))
    return slots


class GpusExecutor(PoolExecutor):
    """A queue served by every visible GPU (see the module doc)."""

    def __init__(
        self,
        runner: Any,
        *,
        gpus: Sequence[GpuInfo] | None = None,
        gpus_per_trial: int = 1,
        jobs_per_gpu: int = 1,
        context_bytes: int = DEFAULT_CONTEXT_BYTES,
        timeout: float | None = None,
        first_number: int = 0,
        progress: TrialProgress | None = None,
        command: Sequence[str] = (),
        processes: int = 1,
    ):
        gpus = list(gpus) if gpus is not None else probe()
        if not gpus:
            raise EnvironmentProblem("--executor gpus: no GPU visible (NVML sees none, or CUDA_VISIBLE_DEVICES hides them)")
        super().__init__(
            runner,
            gpu_slots(gpus, gpus_per_trial=gpus_per_trial, jobs_per_gpu=jobs_per_gpu),
            context_bytes=context_bytes,
            timeout=timeout,
            first_number=first_number,
            progress=progress,
            command=command,
            processes=processes,
        )
