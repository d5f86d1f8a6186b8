"""`plan --confirm`: run the program at the predicted largest size, under the target's budget.

Why: a plan answer is a simulation of fitted laws; one real run at the answer turns it into a
measured one. The runner caps the process (a per-process budget on this device: a cap as
given, a card as its memory less the CUDA context) and reports whether the run completed. A
run that fails steps down by the answer's error bound (at least `MIN_STEP` of the size) and
runs once more, so an answer is confirmed or refuted in at most `max_runs` runs. Pure logic
over a `runner` the caller hands in (`run.runner.run_trial` from the CLI; a fake in tests): no
torch here, and no import of `run/` (which already uses plan's size placeholder).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Sequence

from alloctune.errors import InputError
from alloctune.plan.traceset import as_size, size_text

SCHEMA = "alloctune.plan_confirm/1"
MIN_STEP = Fraction(2, 100)  # the smallest step down after a failure: the monotone check's 2 % grid


@dataclass(frozen=True)
class ConfirmRun:
    size: str
    budget: int
    outcome: str  # the runner's: ok | oom | crash | timeout | ...
    peak_reserved: int | None
    wall_s: float | None

    @property
    def passed(self) -> bool:
        return self.outcome == "ok"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__, passed=self.passed)


@dataclass(frozen=True)
class Confirmation:
    """One target and setting: the predicted largest size against what the GPU showed."""

    conf: str
    target: str  # the plan's label, e.g. "cap 1.00 GiB"
    predicted: str | None
    confirmed: str | None  # the largest size run that completed (None: none did)
    runs: tuple[ConfirmRun, ...]
    note: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "conf": self.conf,
            "target": self.target,
            "predicted": self.predicted,
            "confirmed": self.confirmed,
            "runs": [r.to_dict() for r in self.runs],
            "note": self.note,
        }


Runner = Callable[..., Any]  # run_trial's shape: (command, conf=, budget=, env=) -> TrialResult


def confirm(
    result: Any,
    command: Sequence[str],
    *,
    runner: Runner | None = None,
    max_runs: int = 2,
    size_placeholder: str = "{size}",
    size_env: str = "ALLOCTUNE_SIZE",
    base_env: dict[str, str] | None = None,
) -> list[Confirmation]:
    """Confirm every largest-size answer of `result` (a `PlanResult`) with real runs of `command`
    (`{size}` in it is replaced, `ALLOCTUNE_SIZE` set), at most `max_runs` each."""
    import os

    if not command:
        raise InputError("--confirm needs the program after `--`, with {size} where the input size goes")
    if max_runs < 1:
        raise InputError(f"--confirm-runs must be at least 1, got {max_runs}")
    if runner is None:  # the caller hands the real one in (run.runner.run_trial): plan does not import run/
        raise InputError("--confirm needs a runner")
    env0 = dict(os.environ if base_env is None else base_env)
    grid = as_size(result.step)
    out = []
    for sp in result.settings:
        for item in sp.largest:
            out.append(
                _one(sp.conf, item, result.context_bytes, grid, command, runner, max_runs, size_placeholder, size_env, env0)
            )
    return out


def _one(
    conf: str,
    item: Any,
    context: int,
    grid: Fraction,
    command: Sequence[str],
    runner: Runner,
    max_runs: int,
    placeholder: str,
    size_env: str,
    env0: dict[str, str],
) -> Confirmation:
    t = item.target
    budget = t.bytes if t.kind == "cap" else t.bytes - context  # a card: what the allocator can get on it
    if item.largest is None:
        return Confirmation(conf, t.label, None, None, (), "nothing to confirm: no size fits in the simulation")
    x = as_size(item.largest)
    step = max(MIN_STEP, Fraction(item.bound or 0.0).limit_denominator(10000))
    runs: list[ConfirmRun] = []
    confirmed = None
    while len(runs) < max_runs and x >= grid:
        text = size_text(x)
        cmd = [a.replace(placeholder, text) for a in command]
        # the program's own output goes to stderr: plan's stdout is its table or JSON
        res = runner(cmd, conf=conf or None, budget=budget, env={**env0, size_env: text}, stdout_to_stderr=True)
        runs.append(ConfirmRun(text, budget, res.outcome, res.peak_reserved, res.wall_s))
        if res.outcome == "ok":
            confirmed = text
            break
        if res.outcome not in ("oom", "timeout"):
            break  # not a memory answer: stepping down says nothing
        # step down by the answer's bound (the memory it may be off), on the size grid
        nxt = ((x * (1 - step)) // grid) * grid
        x = nxt if nxt < x else x - grid
    pred = item.largest
    up, why = _upper(item, x, grid) if confirmed == pred and len(runs) < max_runs else (None, "")
    if up is not None:
        # the answer left room for its bound (or is a range) and held: try the size that room would allow
        text = size_text(up)
        res = runner(
            [a.replace(placeholder, text) for a in command],
            conf=conf or None,
            budget=budget,
            env={**env0, size_env: text},
            stdout_to_stderr=True,
        )
        runs.append(ConfirmRun(text, budget, res.outcome, res.peak_reserved, res.wall_s))
        if res.outcome == "ok":
            confirmed = text
    if runs and runs[-1].outcome not in ("ok", "oom", "timeout") and confirmed is None:
        note = (
            f"not confirmed: the run ended with {runs[-1].outcome!r}, not a memory answer (no GPU, a crash): "
            "run the program by hand at the predicted size to see why"
        )
    elif up is not None and confirmed == size_text(up):
        note = (
            f"confirmed above the prediction: {pred} and {confirmed} ({why}) completed under {t.label} in "
            f"{len(runs)} runs: the answer is {confirmed}"
        )
    elif up is not None:
        note = (
            f"confirmed: size {pred} completed under {t.label}; {size_text(up)}, {why}, did not "
            f"({runs[-1].outcome}): the answer is {pred} ({len(runs)} runs)"
        )
    elif confirmed == pred:
        note = f"confirmed: size {pred} completed under {t.label} in 1 run"
    elif confirmed is not None:
        note = (
            f"the prediction {pred} failed on the GPU ({runs[0].outcome}); {confirmed} completed "
            f"({len(runs)} runs): the answer is {confirmed}"
        )
    else:
        last = runs[-1].outcome if runs else "-"
        note = (
            f"not confirmed in {len(runs)} run(s) (last: {last}): the simulation over-promised for this "
            "program; record at a size near the answer and plan again"
        )
    return Confirmation(conf, t.label, pred, confirmed, tuple(runs), note)


def _upper(item: Any, x: Fraction, grid: Fraction) -> tuple[Fraction | None, str]:
    """Where to look once the predicted size held: the optimistic end of a range; a larger size the
    simulation saw complete again above the first failing one (a size law a hair off, or a real
    non-monotone step: one run decides which); the size the answer's error bound kept back (the
    memory it may be off, taken as the same share of the size, as the step down is); or one 2 % step
    for an extrapolated answer with no bound. None when the simulation itself saw the next size fail
    inside the recorded sizes with no bound left. With the size: the words that say why it is tried."""
    opt = getattr(item, "optimistic", None)
    if opt is not None and as_size(opt) > x:
        return as_size(opt), "the optimistic end of its range"
    again = getattr(item, "completes_again", None)
    if again is not None and as_size(again) > x:
        return as_size(again), "a larger size the simulation saw complete again"
    bound = Fraction(item.bound or 0.0).limit_denominator(10000)
    if bound <= 0 and getattr(item, "extrapolated", False):
        # beyond the recordings nothing checked the laws there (a held-back recording reproduced exactly
        # says nothing of sizes 8x further out): one grid step up tells the answer from the truth's step
        bound = MIN_STEP
    if bound <= 0:
        return None, ""
    up = ((x * (1 + bound)) // grid) * grid
    return (up, "the upper end of its error bound") if up > x else (None, "")


__all__ = ["Confirmation", "ConfirmRun", "confirm", "SCHEMA"]


def command_words(text: str | None) -> list[str] | None:
    """--confirm's program as argv, split as a shell would (no shell runs it); None when not given.

    An unbalanced quote or an empty program is an `InputError`, before any recording is read."""
    import shlex

    if text is None:
        return None
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise InputError(f"--confirm {text!r}: {exc}") from None
    if not words:
        raise InputError("--confirm needs a program, e.g. --confirm 'python infer.py --len {size}'")
    return words
