"""Any executor plus the fsynced results store: finished trials are never lost nor run twice.

Whichever executor runs the trials (threads, GPUs, Ray tasks on other machines), their
results come back to this one process, which appends each to the store the moment it
arrives: a single writer, one fsync per trial. A sweep stopped by Ctrl-C, a kill of the
driver or a lost Ray worker loses only the trials that were running; `--resume` skips every
finished one (`ok`/`oom`) and runs the rest. The store's lines do not depend on the executor.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from alloctune.run.trial import TrialRequest, TrialResult
from alloctune.tune.executors.base import Executor
from alloctune.tune.store import TrialStore, trial_key


def request_key(command: Sequence[str], req: TrialRequest) -> str:
    return trial_key(
        command,
        req.conf,
        req.budget,
        req.repeat,
        req.record,
        no_grad=req.no_grad,
        cudnn_benchmark=req.cudnn_benchmark,
        checkpointing=req.checkpointing,
    )


@dataclass(frozen=True)
class StoredTrial:
    """One answered request: `reused` = taken from the store, not run now."""

    request: TrialRequest
    result: TrialResult
    reused: bool


def _reusable(store: TrialStore, key: str, req: TrialRequest) -> TrialResult | None:
    found = store.get(key)
    if found is not None and req.record and not (found.snapshot and Path(found.snapshot).exists()):
        return None  # the recorded history is gone: record it again
    return found


def run_stored(
    executor: Executor, requests: Iterable[TrialRequest], store: TrialStore, command: Sequence[str]
) -> Iterator[StoredTrial]:
    """Answer `requests` from the store where finished, run the rest on `executor` and persist each.

    A request repeated in the batch runs once (its key is the same); both copies get the answer.
    """
    todo: list[TrialRequest] = []
    waiting: dict[str, list[TrialRequest]] = {}
    for req in requests:
        key = request_key(command, req)
        found = _reusable(store, key, req)
        if found is not None:
            yield StoredTrial(req, found, True)
        elif key in waiting:
            waiting[key].append(req)
        else:
            waiting[key] = []
            todo.append(req)
    for req, result in executor.run(todo):
        key = request_key(command, req)
        store.append(key, result)
        yield StoredTrial(req, result, False)
        for twin in waiting.get(key, ()):
            yield StoredTrial(twin, result, True)
