"""Where trials run: `SerialExecutor` here; parallel, per-GPU and Ray executors build on `base`."""

from alloctune.tune.executors.base import Evaluator, Executor, SerialExecutor, TrialRequest

__all__ = ["Evaluator", "Executor", "SerialExecutor", "TrialRequest"]
