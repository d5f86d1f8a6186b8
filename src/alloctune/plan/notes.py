"""What a reader must know to trust `plan`'s answers: conservative or decided, structure, laws, the
recorded sizes' common step, the CUDA context, a min budget above the uncapped peak. Kept apart from
`plan.answer` (the search) so each stays small; the notes read the trace set, counts and the answers
already found, never a replay."""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Sequence

from alloctune.config.standard import setting_label
from alloctune.plan.traceset import TraceSet
from alloctune.sim.settings import SimSettings
from alloctune.units import MiB, format_size


def plan_notes(ts: TraceSet, summary: dict[str, Any], inexact: int, bounded: bool, cards_asked: bool, context: int) -> list[str]:
    """What a reader must know to trust the answers (conservative or bounded, structure, laws, context)."""
    notes = []
    if not ts.fallbacks and (ts.learned is None or ts.learned.decided_by == "none"):
        notes.append(
            "conservative: no fallible-request model in these recordings (a request the program would retry "
            "smaller, such as a cuDNN workspace, is taken as fatal), so real largest sizes can only be larger"
            + (
                f"; 'optimistic' repeats the search with the {inexact} request(s) that look like workspaces (no exact "
                "law, or freed by the next request) fallible down to nothing: the real answer lies between"
                if bounded
                else ""
            )
        )
    elif ts.fallbacks:
        notes.append(f"{len(ts.fallbacks)} fallible request(s) honoured with the fallback sizes recorded at one size")
    if ts.learned is not None and ts.learned.decided_by != "none":
        kept = max(0, inexact - ts.learned.requests)
        why = (
            "their C++ stacks say they are not workspaces"
            if "frames" in ts.learned.decided_by
            else "they never fell back there, so an answer can only be small; a calibration capped near the answer "
            "tests the ones that matter"
        )
        notes.append(
            f"one answer: {ts.learned.requests} workspace request(s) fall back as learned from "
            + "; ".join(e.text() for e in ts.learned.evidence)
            + (f"; the other {kept} workspace-shaped request(s) are taken as fixed ({why})" if kept else "")
        )
    elif ts.learned is not None:
        unplaced = [e for e in ts.learned.evidence if e.learned]
        notes.append(
            (
                "the fallible-request evidence given could not be placed on these recordings (another program, or its "
                "stream differs from theirs): "
                if unplaced
                else "the evidence given shows no request falling back (a calibration whose first failure was fatal, or "
                "that never failed: record one under a cap between the peak allocated and the peak reserved): "
            )
            + "; ".join(e.text() for e in ts.learned.evidence)
        )
    if not ts.identical:
        notes.append(
            "the recordings differ in structure (a branch taken at some sizes only): between two recorded sizes of "
            "different structure, the structure of the nearer one is assumed"
        )
    if "table (inexact)" in summary["laws"]:
        notes.append(f"{summary['laws']['table (inexact)']} request size(s) have no exact law: interpolated between recordings")
    if any(k.endswith("(unverified)") for k in summary["laws"]):
        notes.append("some laws were fitted on no spare recording: record one more size to verify them")
    step = _common_step(ts.sizes)
    if step > 1:
        notes.append(
            f"every recorded size is a multiple of {step}: a rounding the program makes at a finer step (a "
            f"convolution's stride, a padding) is invisible to the laws, and sizes between can need more; record "
            f"one size that is not a multiple of {step} to see it (measured: timm at sides 256/384/512 said 864 "
            f"fits where 809 does not; with 818 and 836 recorded its laws round as the network does)"
        )
    if cards_asked:
        notes.append(f"cards: the CUDA context is taken as {context // MiB} MiB, not available to the allocator")
    return notes


def cap_above_peak_reason(conf: str) -> str:
    """Why a setting's min budget can lie above the peak reserved of its uncapped run (PyTorch's
    `alloc_block`, allocator-spec §3.3): under the default rules a cap at or above that peak is never
    reached, so the run is the uncapped one."""
    st = SimSettings.from_config(conf)
    reasons = []
    if st.expandable_segments:
        reasons.append(
            "under expandable_segments PyTorch checks a cap against a request's whole rounded size, "
            "including the part its segment already has mapped, so a cap at the uncapped peak can "
            "run out of memory"
        )
    if st.garbage_collection_threshold > 0:
        reasons.append(
            "with garbage_collection_threshold a cap switches garbage collection on, which changes "
            "what the run frees and reserves"
        )
    return "; ".join(reasons) or "a cap changes what this setting releases and reserves"


def above_peak_note(points: Sequence[tuple[str, str, int, int]]) -> str | None:
    """The note for min budgets above the uncapped peak reserved: `points` are (setting, size, min
    budget, uncapped peak reserved) where the first exceeds the second, the one to name first; None
    when there are none. Says why, so the answer is not read as an error."""
    if not points:
        return None
    conf, size, need, peak = points[0]
    more = f" (and at {len(points) - 1} other size(s))" if len(points) > 1 else ""
    return (
        f"a min budget above the uncapped peak reserved is no error: {setting_label(conf)} at size {size} needs "
        f"{format_size(need)}, its uncapped run reserves {format_size(peak)}{more}; "
        f"{cap_above_peak_reason(conf)}"
    )


def _common_step(sizes: Sequence[Fraction]) -> int:
    """The largest whole number every recorded size is a multiple of (1: none, or sizes not whole)."""
    from math import gcd

    if any(x.denominator != 1 for x in sizes):
        return 1
    g = 0
    for x in sizes:
        g = gcd(g, int(x))
    return g
