"""The one call behind `alloctune plan`: inputs -> trace set -> (save, held-back check) -> answers.

Kept apart from `answer.plan` so the CLI stays parse -> call -> render and the Python API
can do the same in one line (`run(["a.pickle:1024", ...], caps=[...])`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from alloctune.errors import InputError
from alloctune.plan import fileformat
from alloctune.plan.answer import plan
from alloctune.plan.bound import ErrorModel
from alloctune.plan.holdout import Holdout, holdout
from alloctune.plan.inputs import load_recordings, parse_spec, traceset_from
from alloctune.plan.result import PlanResult
from alloctune.plan.rvc import RvcRow, rvc_rows
from alloctune.plan.traceset import build, size_text
from alloctune.progress import no_progress

SCHEMA = "alloctune.plan_report/1"


@dataclass(frozen=True)
class PlanReport:
    result: PlanResult
    saved: str | None = None
    saved_bytes: int | None = None
    holdout: Holdout | None = None
    rvc: tuple[RvcRow, ...] = ()
    figure: str | None = None
    figure_skipped: str | None = None
    wall_s: float = 0.0  # everything: loading, aligning and fitting, the check, answering
    exported: str | None = None  # the generated stream written by export=
    confirmations: tuple[Any, ...] = ()  # plan.confirm.Confirmation per target and setting (confirm=)

    def to_dict(self) -> dict[str, Any]:
        d = self.result.to_dict()
        d["report_schema"] = SCHEMA
        d["saved"] = self.saved
        d["saved_bytes"] = self.saved_bytes
        d["holdout"] = self.holdout.to_dict() if self.holdout else None
        d["rvc"] = [r.to_dict() for r in self.rvc]
        d["figure"] = self.figure
        d["figure_skipped"] = self.figure_skipped
        d["total_wall_s"] = self.wall_s
        d["exported"] = self.exported
        d["confirmations"] = [c.to_dict() for c in self.confirmations]
        return d


def run(
    inputs: Sequence[str],
    *,
    save: str | Path | None = None,
    hold_back: str | None = None,
    png: str | Path | None = None,
    rvc: bool = False,
    rvc_pad: float = 3.0,
    rvc_fp32: bool = False,
    export: str | None = None,
    check: bool = True,
    confirm: Sequence[str] | None = None,
    confirm_runs: int = 2,
    runner: Any = None,
    calibrations: Sequence[str] = (),
    store: str | Path | None = None,
    **plan_kwargs: Any,
) -> PlanReport:
    """Build or load the trace set, optionally save it, check it on a held-back recording, write the
    stream generated at one size (`export="SIZE:FILE"`, an alloctune compact trace that `simulate`
    and `trace` read), and plan; `confirm` (a command, `{size}` where the input size goes): run it at
    each predicted largest size under the target's budget (`plan.confirm`). `calibrations` (capped
    recordings FILE[:SIZE]) and `store` (a tune store of the program), together with C++ frames in
    the recordings and the capped recordings of a `record --size` directory, decide which requests
    the program gives up under a cap (`plan.fallible`), so each answer is one number."""
    t0 = time.perf_counter()
    held = None
    errors = None
    say = plan_kwargs.get("progress") or no_progress
    say(f"reading {len(inputs)} input(s)", 0, None)
    saved_set = any(Path(parse_spec(i)[0]).is_file() and fileformat.is_traceset(parse_spec(i)[0]) for i in inputs)
    if hold_back is not None:
        if saved_set:
            raise InputError("--hold-back needs the recordings themselves (FILE:SIZE ...), not a saved trace set")
        recs = load_recordings(inputs)
        if len(recs) < 3:
            raise InputError("--hold-back needs recordings at three or more sizes (two to fit, one to check)")
        held = holdout(recs, hold_back, plan_kwargs.get("torch"))
        ts = build(recs)
    elif saved_set:
        ts = traceset_from(inputs)
        recs = []
    else:
        recs = load_recordings(inputs)
        recs += _survived(calibrations, inputs, recs)
        if len(recs) < 2:
            raise InputError("recordings at two or more input sizes are needed (FILE:SIZE FILE:SIZE ...)")
        ts = build(recs)
    ts = _with_learned(ts, recs, inputs, calibrations, store)
    if check and not saved_set and (plan_kwargs.get("cards") or plan_kwargs.get("caps")):
        recs = recs or load_recordings(inputs)
        if len(recs) >= 3:
            say(f"error bound: the largest of {len(recs)} recordings generated from the others", 0, None)
            errors = error_model(recs, held, plan_kwargs.get("torch"))
    saved = saved_bytes = None
    if save is not None:
        saved_bytes = fileformat.save(ts, save)
        saved = str(save)
    exported = None
    if export is not None:
        exported = _export(ts, export)
    result = plan(ts, errors=errors, failed=_died(calibrations, inputs, recs), **plan_kwargs)
    rows = tuple(rvc_rows(result, rvc_pad, not rvc_fp32)) if rvc else ()
    figure = skipped = None
    if png is not None:
        from alloctune.plan.figure import budget_figure

        skipped = budget_figure(result, png)
        figure = None if skipped else str(png)
    confirmations: tuple[Any, ...] = ()
    if confirm is not None:
        from alloctune.plan.confirm import confirm as confirm_runs_of

        confirmations = tuple(confirm_runs_of(result, confirm, runner=runner, max_runs=confirm_runs))
    return PlanReport(result, saved, saved_bytes, held, rows, figure, skipped, time.perf_counter() - t0, exported, confirmations)


def _survived(calibrations: Sequence[str], inputs: Sequence[str], recs: Sequence[tuple[Any, Any]]) -> list:
    """Calibrations the program survived, as recordings at sizes not recorded (`plan.fallible.survived`)."""
    if not calibrations:
        return []
    from alloctune.plan.fallible import survived
    from alloctune.plan.inputs import load_calibrations

    return survived(load_calibrations(calibrations, inputs), recs)


def _died(calibrations: Sequence[str], inputs: Sequence[str], recs: Sequence[tuple[Any, Any]]) -> list:
    """Calibrations that died: real failures no answer may reach (`plan.fallible.died`)."""
    if not calibrations:
        return []
    from alloctune.plan.fallible import died
    from alloctune.plan.inputs import load_calibrations

    return died(load_calibrations(calibrations, inputs), recs)


def _with_learned(
    ts: Any, recs: Sequence[tuple[Any, Any]], inputs: Sequence[str], calibrations: Sequence[str], store: str | Path | None
) -> Any:
    """The trace set with the fallible requests every piece of evidence teaches (`plan.fallible.learn`)."""
    from dataclasses import replace

    from alloctune.plan.fallible import learn
    from alloctune.plan.inputs import load_calibrations

    cals = load_calibrations(calibrations, inputs)
    learned = learn(ts, recs, cals, store)
    if learned is None:
        return ts
    if ts.learned is not None:  # a saved trace set keeps what it learned before
        learned = learned.merged(ts.learned)
    return replace(ts, learned=learned)


def error_model(recs: Sequence[tuple[Any, Any]], held: Holdout | None, torch: str | None) -> ErrorModel:
    """The answers' error bound from what can be checked: the largest recording held back (fit on
    the rest, generate it: the error of extrapolating one step), and an interior --hold-back
    check when one was made. Errors are of the simulated peak reserved, generated vs recorded."""
    from alloctune.plan.traceset import as_size

    xs = tuple(sorted(as_size(x) for x, _ in recs))
    top = next(x for x, _ in recs if as_size(x) == xs[-1])
    ext = holdout(recs, top, torch)
    checked = abs(ext.error_vs_replay)
    inside = abs(held.error_vs_replay) if held is not None and as_size(held.size) != xs[-1] else 0.0
    evidence = (
        f"the largest recording ({size_text(xs[-1])}) generated from the others is off by "
        f"{ext.error_vs_replay:+.2%} in peak reserved; beyond it the allowance grows with the cube of the "
        f"distance in steps of {size_text(xs[-1] - xs[-2])}"
    )
    if held is not None and inside:
        evidence += f"; inside the recorded sizes {inside:.2%} (the held-back size {held.size})"
    return ErrorModel(inside, checked, xs, evidence)


def _export(ts: Any, spec: str) -> str:
    from alloctune.trace.compact import save_compact

    size, sep, path = spec.partition(":")
    if not sep or not path:
        raise InputError(f"--export {spec!r}: give SIZE:FILE, e.g. --export 45:rvc-45.atrace")
    if not Path(path).parent.exists():
        raise InputError(f"--export: directory {str(Path(path).parent)!r} does not exist")
    gen = ts.generate(size)
    gen.trace.meta["generated_notes"] = gen.notes()
    save_compact(gen.trace, path)
    return path
