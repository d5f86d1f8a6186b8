"""`--executor ray [--address auto|HOST:PORT]`: every trial a Ray task on a GPU or a fraction of one.

People who run sweeps on a cluster already have Ray: it places work, packs fractional GPUs
and survives lost nodes. Each trial becomes one task asking for `num_gpus` = its budget plus
a CUDA context over the card's memory (rounded up to `granularity`), or a whole GPU when it
has no budget or must run alone; Ray then sets `CUDA_VISIBLE_DEVICES` in the worker, and the
trial's child process inherits it. Results come back to the driver, which owns the store
(`stored.run_stored`), so a lost worker costs only its own trial: it comes back as a `crash`
(never reused by `--resume`), every finished trial is already on disk.

Ray is optional (`pip install 'alloctune[ray]'`) and imported only when this executor runs.
Every node needs alloctune installed, and `TrialSpec.workdir` on storage they share (the
recorded baseline and the logs are written there).
"""

from __future__ import annotations

import math
import os
import socket
from typing import Any, Iterable, Iterator, Sequence

from alloctune.errors import AlloctuneError, EnvironmentProblem, InputError
from alloctune.progress import NullProgress, TrialProgress
from alloctune.run.trial import TrialRequest, TrialResult
from alloctune.tune.executors.tasks import (
    DEFAULT_CONTEXT_BYTES,
    Numbering,
    TimeoutPolicy,
    TrialTask,
    as_runner,
    failed_trial,
)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise EnvironmentProblem("--executor ray needs Ray: pip install 'alloctune[ray]'") from None
    return ray


def gpu_fraction(
    req: TrialRequest, gpu_memory: int | None, context_bytes: int, granularity: float = 0.05, processes: int = 1
) -> float:
    """The `num_gpus` a trial asks Ray for: its budget plus a context (per process) over the card, rounded up."""
    if req.exclusive or req.budget is None or not gpu_memory:
        return 1.0
    frac = max(1, processes) * (int(req.budget) + context_bytes) / gpu_memory
    steps = math.ceil(frac / granularity - 1e-9)
    return min(1.0, max(granularity, round(steps * granularity, 6)))


def _run_on_worker(runner: Any, task: TrialTask) -> dict[str, Any]:
    """Body of the Ray task: Ray has put this worker's GPU(s) in CUDA_VISIBLE_DEVICES already."""
    where = f"{socket.gethostname()}:gpu{os.environ.get('CUDA_VISIBLE_DEVICES', '?')}"
    result = runner.run_task(task, {})
    return {"result": result.to_dict(), "worker": where}


class RayExecutor:
    """Runs trials as Ray tasks; yields each result as it arrives (see the module doc).

    `address`: None starts a local Ray instance (`init_kwargs` go to `ray.init`, e.g.
    `num_cpus`), "auto" or HOST:PORT joins a running cluster. `gpu_memory`: a card's bytes,
    to size fractions (default: learned from the first result that reports it; until then
    each trial asks for a whole GPU). `max_retries`: Ray's retries of a task whose worker
    died (0: the trial is a crash and `--resume` runs it again). `gpus_per_trial` > 1: each
    trial gets that many whole GPUs (a `torchrun` job with one rank per card).
    """

    side_by_side = True  # Ray packs trials onto a node whenever it has room

    def __init__(
        self,
        runner: Any,
        *,
        address: str | None = None,
        gpu_memory: int | None = None,
        context_bytes: int = DEFAULT_CONTEXT_BYTES,
        granularity: float = 0.05,
        cpus_per_trial: float = 1.0,
        timeout: float | None = None,
        first_number: int = 0,
        max_retries: int = 0,
        progress: TrialProgress | None = None,
        command: Sequence[str] = (),
        processes: int = 1,
        gpus_per_trial: int = 1,
        init_kwargs: dict[str, Any] | None = None,
    ):
        if address is not None and address != "auto" and ":" not in address:
            raise InputError(f"--address must be 'auto' or HOST:PORT, got {address!r}")
        if not 0 < granularity <= 1:
            raise InputError("the GPU fraction granularity must be in (0, 1]")
        self.runner = as_runner(runner)
        self.address = address
        self.gpu_memory = gpu_memory
        self.context_bytes = int(context_bytes)
        self.granularity = granularity
        self.cpus_per_trial = cpus_per_trial
        self.timeouts = TimeoutPolicy(timeout)
        self.numbers = Numbering(first_number)
        self.max_retries = max_retries
        self.progress = progress or NullProgress()
        self.command = tuple(command)
        if gpus_per_trial < 1:
            raise InputError("--gpus-per-trial must be at least 1")
        self.processes = max(1, int(processes))
        self.gpus_per_trial = int(gpus_per_trial)
        self.init_kwargs = dict(init_kwargs or {})
        self.started_ray = False

    def _ray(self) -> Any:
        ray = import_ray()
        if not ray.is_initialized():
            kwargs = {"include_dashboard": False, "log_to_driver": False, **self.init_kwargs}
            if self.address is not None:
                kwargs["address"] = self.address
            try:
                ray.init(**kwargs)
            except ConnectionError as exc:
                raise EnvironmentProblem(f"cannot reach the Ray cluster at {self.address}: {exc}") from None
            self.started_ray = True
        return ray

    def close(self) -> None:
        """Shut down the Ray instance this executor started (a joined cluster is left alone)."""
        if self.started_ray:
            import_ray().shutdown()
            self.started_ray = False

    def run(self, requests: Iterable[TrialRequest]) -> Iterator[tuple[TrialRequest, TrialResult]]:
        ray = self._ray()
        remote = ray.remote(_run_on_worker)
        pending: dict[Any, TrialTask] = {}
        requests = list(requests)
        self.progress.begin(["ray"], len(requests))
        clean = False
        try:
            for req in requests:
                task = TrialTask(req, self.numbers.next(), self.timeouts.next())
                frac = (
                    float(self.gpus_per_trial)
                    if self.gpus_per_trial > 1  # whole cards, one rank each
                    else gpu_fraction(req, self.gpu_memory, self.context_bytes, self.granularity, self.processes)
                )
                ref = remote.options(
                    num_gpus=frac,
                    num_cpus=self.cpus_per_trial,
                    max_retries=self.max_retries,
                    name=f"alloctune-trial-{task.number}",
                ).remote(self.runner, task)
                pending[ref] = task
                self.progress.started(task, "ray")  # submitted: Ray does not say when it starts
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                for ref in ready:
                    task = pending.pop(ref)
                    result, worker = self._collect(ray, ref, task)
                    if result.total_memory and not self.gpu_memory:
                        self.gpu_memory = int(result.total_memory)
                    self.timeouts.observe(task.request, result)
                    self.progress.finished(task, worker, result)
                    yield task.request, result
            clean = True
        except (KeyboardInterrupt, SystemExit):
            raise  # the driver is going: its job's workers, and their trials, go with it
        except BaseException:  # closed early, or an error: stop what is left
            self._cancel(ray, pending)
            raise
        finally:
            self.progress.end(interrupted=not clean)

    @staticmethod
    def _cancel(ray: Any, pending: Iterable[Any]) -> None:
        """Closed early by the caller: KeyboardInterrupt in each task stops its trial.

        Not on Ctrl-C or SIGTERM. There `ray.cancel` races with a task finishing at that moment and
        Ray aborts the whole driver ("Check failed: it != submissible_tasks_.end()", ray-project/ray
        #54846): 6 of 40 interrupted sweeps on a loaded 2-core machine, 0 of 35 without it. Ray
        needs no cancel there: when the driver disconnects (`ray.shutdown()`, or its process ends)
        the raylets kill the job's workers, and each trial dies with its worker (the runner's
        watchdog pipe); on a joined local cluster the workers were gone 7 s after the driver exited.
        """
        for ref in pending:
            try:
                ray.cancel(ref)
            except Exception:
                pass

    def _collect(self, ray: Any, ref: Any, task: TrialTask) -> tuple[TrialResult, str]:
        try:
            out = ray.get(ref)
            return TrialResult.from_dict(out["result"]), out["worker"]
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, AlloctuneError):
                raise cause from None
            return failed_trial(
                task.request, f"ray task failed: {type(cause or exc).__name__}: {cause or exc}", self.command
            ), "ray"
        except ray.exceptions.RayError as exc:  # worker or node lost, task cancelled
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return failed_trial(task.request, f"ray worker lost: {type(exc).__name__}: {first}", self.command), "ray"
