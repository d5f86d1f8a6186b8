"""Where trials run: one after another, side by side on one GPU, one per GPU, or as Ray tasks.

`base` holds the contract (`Executor`, `Evaluator`, `SerialExecutor`; the request they run is
`run.trial.TrialRequest`);
`tasks` the unit shipped to workers; `local`, `gpus`, `ray_tasks` the executors; `stored`
joins any of them to the fsynced store; `factory.make_executor` maps `--executor` to one.
Ray is imported only inside `ray_tasks.RayExecutor.run`.
"""

from alloctune.run.trial import TrialRequest
from alloctune.tune.executors.base import Evaluator, Executor, SerialExecutor
from alloctune.tune.executors.tasks import TrialRunner, TrialTask

__all__ = ["Evaluator", "Executor", "SerialExecutor", "TrialRequest", "TrialRunner", "TrialTask"]
