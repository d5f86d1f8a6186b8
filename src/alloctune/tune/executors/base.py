"""The contract between the sweep (what to run) and an executor (where and how many at once).

The tuner decides *which* trials it needs; an executor decides *where* they run: one after
another on this GPU, several side by side on it (a per-process cap leaves room for others),
one per visible GPU, or as tasks on a Ray cluster. Keeping the two apart lets every
strategy run on every executor, and lets tests drive the strategy with fake trials.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Protocol, Sequence

from alloctune.run.trial import TrialRequest, TrialResult


class Evaluator(Protocol):
    """Runs one trial in the calling thread (the runner on a GPU, a fake in tests)."""

    def __call__(
        self, conf: str, budget: int | None, *, repeat: int = 0, record: bool = False, ensure_cap: bool = False
    ) -> TrialResult: ...


class Executor(Protocol):
    """Runs a batch of independent trials and yields each result as soon as it is known (any order)."""

    def run(self, requests: Iterable[TrialRequest]) -> Iterator[tuple[TrialRequest, TrialResult]]: ...


def start_ahead(runner: Any, count: int) -> None:
    """Ask the runner on this host (or the evaluator inside it) to start its next `count` trials
    beside the recorded baseline (`run.warm`); runners that cannot (fakes, Ray) are left alone."""
    target = getattr(runner, "evaluator", runner)
    start = getattr(target, "start_ahead", None)
    if callable(start) and count > 0:
        start(count)


def close_ahead(runner: Any) -> str | None:
    """End the runner's processes not taken; why some were not started ahead (None: all were, or none asked)."""
    target = getattr(runner, "evaluator", runner)
    close = getattr(target, "close_ahead", None)
    note = close() if callable(close) else None
    return note if isinstance(note, str) else None


class SerialExecutor:
    """Today's behaviour: one trial after another through one evaluator."""

    def __init__(self, evaluator: Evaluator):
        self.evaluator = evaluator

    def start_ahead(self) -> None:
        """The run after the baseline starts beside it (one: runs here go one after another)."""
        start_ahead(self.evaluator, 1)

    def close_ahead(self) -> str | None:
        return close_ahead(self.evaluator)

    def run(self, requests: Iterable[TrialRequest]) -> Iterator[tuple[TrialRequest, TrialResult]]:
        for req in requests:
            yield req, self.evaluator(req.conf, req.budget, **req.call_options())


class BatchRecorder(SerialExecutor):
    """A serial executor that keeps every batch it was handed (`batches`): which runs a flow put side
    by side and which alone on the GPU, for a dry run of the flow (bench) or a test."""

    def __init__(self, evaluator: Evaluator):
        super().__init__(evaluator)
        self.batches: list[list[TrialRequest]] = []

    def run(self, requests: Iterable[TrialRequest]) -> Iterator[tuple[TrialRequest, TrialResult]]:
        reqs = list(requests)
        self.batches.append(reqs)
        return super().run(reqs)

    def wall(self) -> int:
        return wall_in_runs(self.batches)

    def layout(self) -> str:
        """The batches after the recording: `[2]` two side by side, `+1x` one alone."""
        parts = []
        for reqs in self.batches[1:]:
            alone = sum(1 for r in reqs if _alone(r))
            side = len(reqs) - alone
            parts.append((f"[{side}]" if side else "") + (f"+{alone}x" if alone else ""))
        return " ".join(parts) or "-"


def _alone(req: TrialRequest) -> bool:
    """A run that has the GPU to itself: a throughput sample, or the uncapped recording."""
    return req.exclusive or req.budget is None


def wall_in_runs(batches: Iterable[Sequence[TrialRequest]]) -> int:
    """A flow's wall time in runs of the workload: each run alone counts one, the runs side by side in
    a batch count one together (each is capped; the GPU holds them at once)."""
    total = 0
    for reqs in batches:
        alone = sum(1 for r in reqs if _alone(r))
        total += alone + (1 if alone < len(reqs) else 0)
    return total
