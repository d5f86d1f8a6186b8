"""Tuning the allocator setting for one workload: candidates, the sweep, the store, the answer.

Pure Python over plain data (no torch): the GPU trials come from an `Evaluator`, which in
the CLI is `alloctune.run.runner.TrialEvaluator` and in tests a fake. `tune(command, ...)` is
the whole thing in one call (`alloctune.api.tune`); see `alloctune.tune.session`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from alloctune.tune.session import TuneOutcome


def tune(command: Sequence[str], **options: Any) -> TuneOutcome:
    """Tune `command` (see `alloctune.tune.session.prepare` for the options) → `TuneOutcome`.

    Imported lazily so `import alloctune.tune` stays cheap.
    """
    from alloctune.tune.session import tune as _tune

    return _tune(command, **options)
