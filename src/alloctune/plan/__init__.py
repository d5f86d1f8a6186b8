"""Capacity planning: the largest input that fits a card, and the card an input needs.

Recordings of one program at several input sizes become a size-parametric trace
(`traceset.build`: aligned streams, an exact size law per request), saved in a compact
versioned file (`fileformat`); `plan()` replays the generated stream for any size with the
exact simulator to find, per allocator setting, the largest size each card or cap
completes, the min budget as a function of size, and the card one size needs
(`answer`); `holdout` checks the fit on a recording it did not see. Pure core: no torch.
"""

from __future__ import annotations

from typing import Any, Sequence

from alloctune.plan.result import PlanResult
from alloctune.plan.traceset import TraceSet, build


def plan(
    source: TraceSet | str | Sequence[str], *, calibrations: Sequence[str] = (), store: Any = None, **kwargs: Any
) -> PlanResult:
    """Answer the capacity questions for a trace set, a `.atraceset` path, or `FILE:SIZE` specs.

    `calibrations` (capped runs or C++-stack recordings, `FILE[:SIZE]`) and `store` (a tune store)
    decide the program's fallible workspaces (`plan.fallible`; `plan.service.run` also reads the
    recordings' own frames). Other keyword arguments are those of `alloctune.plan.answer.plan`
    (confs, cards, caps, size, ...).
    """
    from dataclasses import replace

    from alloctune.plan.answer import plan as answer
    from alloctune.plan.fallible import learn
    from alloctune.plan.inputs import load_calibrations, traceset_from

    if not isinstance(source, TraceSet):
        source = traceset_from([source] if isinstance(source, str) else list(source))
    if calibrations or store is not None:
        learned = learn(source, (), load_calibrations(calibrations), store)
        if learned is not None:
            source = replace(source, learned=learned if source.learned is None else learned.merged(source.learned))
    return answer(source, **kwargs)


__all__ = ["plan", "build", "TraceSet", "PlanResult"]
