"""The measured forms: a remedy no rewrite of the recording makes exact, measured by one run of the
program with it, and the requests for those confirming runs.

* Inference with autograd on (the baseline's agent saw modules called with grad mode on and no
  backward): ONE confirming run, capped at the budget, recorded, with the agent's no-grad switch
  (`no_grad_request`; the user's code is not changed). It is measured: whether the program completes
  at the budget without autograd, its peaks, and the min budget its own recording simulates to.
* The cuDNN switch, where no setting fits (the recording shows convolution workspaces by C++ frames or
  Python stacks, giving them all up would fit the budget, and the run record says which way
  `torch.backends.cudnn.benchmark` was): ONE confirming run the other way, set by the agent at torch
  import (`cudnn_request`); the algorithms, hence every workspace, change with it, which no recording
  shows, so only a run measures it. Where a setting fits, the switch saves a few percent at most (2-5 %
  on the H200's convnets) and is listed with its confirming command instead: tune's runs stay three.
* Activation checkpointing, where no setting fits and the baseline trained: ONE confirming run with
  the agent switching it on (`checkpointing_request`); the run has the last word over the simulated
  rewrite (`remedy.training`).

Each measured form is a `Remedy` like the simulated ones (`remedy.model`), with the method
`measured`, or "needs a confirming run" when the run could not measure it (the program undid the
switch), so `tune` lists them beside the simulated ones in one table.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from alloctune.analysis.core import analyse
from alloctune.remedy.model import MEASURED, Remedy, min_budget
from alloctune.remedy.training import block_windows
from alloctune.remedy.workspaces import SHAPE_EVIDENCE, cudnn_requests, resized
from alloctune.run.trial import TrialRequest, TrialResult
from alloctune.trace.fallible import NO_WORKSPACE
from alloctune.units import MiB, format_size

NO_GRAD_LINE = "with torch.inference_mode():  # or torch.no_grad(), around the model's forward calls"


def no_grad_request(baseline: TrialResult, conf: str, budget: int) -> TrialRequest | None:
    """The confirming run of `torch.no_grad()`, when the baseline ran inference with autograd on."""
    if not baseline.inference_with_grad:
        return None
    return TrialRequest(
        conf,
        budget,
        record=True,
        ensure_cap=True,
        no_grad=True,
        purpose="remedy: autograd off by the agent (what torch.no_grad() would save): confirm",
    )


def no_grad_remedy(trial: TrialResult, conf: str, base: int | None, simulator_factory: Any, command: str) -> Remedy:
    """The measured no-grad remedy from its confirming run (capped at the budget, recorded)."""
    regrad = int((trial.autograd or {}).get("module_calls_with_grad") or 0)
    if regrad:  # the program turned autograd back on under the agent's switch: this run measured nothing
        return Remedy.unconfirmed(
            "no_grad",
            "inference without autograd (the recording ran no backward, yet kept grad mode on)",
            NO_GRAD_LINE,
            conf,
            confirm=f"alloctune run --budget {trial.budget}B -- {command}  (with the line added by hand)",
            notes=(
                f"not measured: the program turns autograd back on itself ({regrad} module calls ran with grad "
                "on under the agent's switch: torch.enable_grad() or set_grad_enabled(True) in its code); add "
                "the line by hand where it does that and run the confirming command",
            ),
        )
    return _measured(
        trial,
        conf,
        base,
        simulator_factory,
        "no_grad",
        "inference without autograd (the recording ran no backward, yet kept grad mode on)",
        NO_GRAD_LINE,
        f"alloctune run --no-grad --budget {trial.budget}B -- {command}  (the run tune made)",
        (
            "completed at {budget} with autograd off (measured)",
            "ran out of memory at {budget} even with autograd off (measured)",
            "did not complete with autograd off ({detail}): the program needs autograd somewhere",
        ),
    )


# The smallest cuDNN workspace, as a share of the budget, for which the switch gets a confirming run: below
# it the switch cannot move the min budget by the tolerance tune works to.
CUDNN_MIN_SHARE = 0.02


def cudnn_request(baseline: TrialResult, trace: Any, conf: str, budget: int) -> TrialRequest | None:
    """The confirming run of the cuDNN switch the other way than the recording ran, when the
    recording shows convolution workspaces (not the shape alone) of at least `CUDNN_MIN_SHARE` of the
    budget, the run record says how `cudnn.benchmark` was, and the recording with every one of those
    workspaces given up (the switch's lower bound) fits the budget under `conf`."""
    if baseline.cudnn_benchmark is None or trace is None:
        return None
    found, evidence = cudnn_requests(trace)
    sizes = trace.requests.sizes
    if not found or evidence == SHAPE_EVIDENCE or max(sizes[i] for i in found) < CUDNN_MIN_SHARE * budget:
        return None
    bound = min_budget(resized(trace, {i: NO_WORKSPACE for i in found if sizes[i] > NO_WORKSPACE}), conf, trace)
    if bound is None or bound > budget:
        return None
    flip = not baseline.cudnn_benchmark
    return TrialRequest(
        conf,
        budget,
        record=True,
        ensure_cap=True,
        cudnn_benchmark=flip,
        purpose=f"remedy: torch.backends.cudnn.benchmark = {flip} by the agent: confirm",
    )


def checkpointing_request(baseline: TrialResult, trace: Any, conf: str, budget: int) -> TrialRequest | None:
    """The confirming run of activation checkpointing, where no setting fits: when the baseline trained
    (it ran backward) and its recording shows repeated blocks to checkpoint (`remedy.training`). The
    agent switches it on in the program as its library offers it; the run is capped and recorded."""
    if trace is None or not (baseline.autograd or {}).get("backward_calls"):
        return None
    if not block_windows(analyse(trace)):
        return None
    return TrialRequest(
        conf,
        budget,
        record=True,
        ensure_cap=True,
        checkpointing=True,
        purpose="remedy: activation checkpointing switched on by the agent: confirm",
    )


def checkpointing_measured(
    trial: TrialResult, conf: str, base: int | None, simulator_factory: Any, command: str, code: str
) -> Remedy:
    """The measured checkpointing remedy from its confirming run."""
    what = "activation checkpointing of the repeated blocks"
    confirm = f"alloctune run --checkpointing --budget {trial.budget}B -- {command}"
    if trial.checkpointing is not None and not trial.checkpointing:
        return Remedy.unconfirmed(
            "checkpointing",
            what,
            code,
            conf,
            confirm=confirm,
            notes=("not measured: the agent found no model it could switch checkpointing on in",),
        )
    switched = "; ".join(trial.checkpointing or ())
    rem = _measured(
        trial,
        conf,
        base,
        simulator_factory,
        "checkpointing",
        what,
        code,
        confirm,
        (
            "completed at {budget} with checkpointing on (measured)",
            "ran out of memory at {budget} even with checkpointing on (measured)",
            "did not complete with checkpointing on ({detail})",
        ),
    )
    return replace(rem, notes=(*rem.notes, f"switched on: {switched}") if switched else rem.notes)


def cudnn_remedy(trial: TrialResult, conf: str, base: int | None, simulator_factory: Any, command: str) -> Remedy:
    """The measured cuDNN switch from its confirming run (capped at the budget, recorded)."""
    flip = bool(trial.cudnn_benchmark_set)
    name = f"cudnn_benchmark_{'on' if flip else 'off'}"
    what = f"cuDNN autotuning {'on' if flip else 'off'} (torch.backends.cudnn.benchmark = {flip})"
    how = f"torch.backends.cudnn.benchmark = {flip}  # before the model runs"
    confirm = f"alloctune run --cudnn-benchmark {'on' if flip else 'off'} --budget {trial.budget}B -- {command}"
    if trial.cudnn_benchmark is not None and trial.cudnn_benchmark != flip:  # the program set it back itself
        return Remedy.unconfirmed(
            name,
            what,
            how,
            conf,
            confirm=confirm,
            notes=(
                "not measured: the program sets torch.backends.cudnn.benchmark itself (it was "
                f"{trial.cudnn_benchmark} at the end of the agent's run); change it where the program "
                "does and run the confirming command",
            ),
        )
    return _measured(
        trial,
        conf,
        base,
        simulator_factory,
        name,
        what,
        how,
        confirm,
        (
            "completed at {budget} (measured)",
            "ran out of memory at {budget} with the switch (measured)",
            "did not complete with the switch ({detail})",
        ),
    )


def _measured(
    trial: TrialResult,
    conf: str,
    base: int | None,
    simulator_factory: Any,
    name: str,
    what: str,
    how: str,
    confirm: str,
    outcomes: tuple[str, str, str],
) -> Remedy:
    """A remedy measured by its confirming run: its outcome (`outcomes`: completed, out of memory,
    anything else, with {budget} and {detail}), and where it completed, the min budget (or range) its
    own recording simulates to, against `base` (the recording's with the remedy off)."""
    mb = floor = None
    notes: list[str] = []
    if trial.passed and trial.snapshot and simulator_factory is not None:
        mb, floor, notes = _simulated(simulator_factory, trial, conf)
    ok, oom, other = outcomes
    if trial.passed:
        outcome = ok.format(budget=format_size(trial.budget or 0))
        if mb is not None:
            outcome += f"; its recording simulates to a min budget of {_span(floor, mb)}"
    elif trial.outcome == "oom":
        outcome = oom.format(budget=format_size(trial.budget or 0))
    else:
        outcome = other.format(detail=f"{trial.outcome}: {trial.error or 'no detail'}")
    return Remedy(
        name,
        what,
        mb,
        None if mb is None or base is None else base - mb,
        trial.peak_reserved,
        trial.peak_allocated,
        0,
        0.0,
        how,
        MEASURED,
        conf,
        confirm=confirm,
        bound=floor,
        notes=(outcome, *notes),
    )


def _simulated(simulator_factory: Any, trial: TrialResult, conf: str) -> tuple[int | None, int | None, list[str]]:
    """(min budget of a remedy's own recording as it ran, the optimistic end when workspace-shaped
    requests could lower it by more than 2 %, notes). A run at the user's budget rarely presses cuDNN
    into its fallbacks, so where those requests matter the number is a range, and the range is said."""
    try:
        sim = simulator_factory(trial)
        mb = sim.estimates([conf]).get(conf)
    except Exception as exc:  # noqa: BLE001 - the run's own outcome still stands
        return None, None, [f"its recording could not be simulated ({type(exc).__name__}: {exc})"]
    floor = None
    floors = getattr(sim, "floors", None)
    if mb is not None and floors is not None:
        try:
            low = floors([conf]).get(conf)
        except Exception:  # noqa: BLE001 - the estimate alone
            low = None
        if low is not None and low < mb - max(MiB, mb // 50):
            floor = low
    said = (
        []
        if floor is None
        else [
            f"where in {_span(floor, mb)} its need lies depends on the cuDNN workspaces it gives up under a cap, which "
            f"its run at {format_size(trial.budget or 0)} did not press; a recorded run capped near {format_size(floor)} "
            "(alloctune run --budget ... --record) settles it"
        ]
    )
    return mb, floor, said


def _span(floor: int | None, mb: int) -> str:
    return format_size(mb) if floor is None else f"{format_size(floor)} .. {format_size(mb)}"
