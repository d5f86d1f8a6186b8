"""What a reader must know to trust `plan`'s answers: conservative or decided, structure, laws, the
recorded sizes' common step, the CUDA context. Kept apart from `plan.answer` (the search) so each
stays small; the notes read only the trace set and counts, never a replay."""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Sequence

from alloctune.plan.traceset import TraceSet
from alloctune.units import MiB


def plan_notes(ts: TraceSet, summary: dict[str, Any], inexact: int, bounded: bool, cards_asked: bool,
           context: int) -> list[str]:
    """What a reader must know to trust the answers (conservative or bounded, structure, laws, context)."""
    notes = []
    if not ts.fallbacks and (ts.learned is None or ts.learned.decided_by == "none"):
        notes.append(
            "conservative: no fallible-request model in these recordings (a request the program would retry "
            "smaller, such as a cuDNN workspace, is taken as fatal), so real largest sizes can only be larger"
            + (f"; 'optimistic' repeats the search with the {inexact} request(s) that look like workspaces (no exact "
               "law, or freed by the next request) fallible down to nothing: the real answer lies between"
               if bounded else "")
        )
    elif ts.fallbacks:
        notes.append(f"{len(ts.fallbacks)} fallible request(s) honoured with the fallback sizes recorded at one size")
    if ts.learned is not None and ts.learned.decided_by != "none":
        kept = max(0, inexact - ts.learned.requests)
        why = ("their C++ stacks say they are not workspaces" if "frames" in ts.learned.decided_by else
               "they never fell back there, so an answer can only be small; a calibration capped near the answer "
               "tests the ones that matter")
        notes.append(
            f"one answer: {ts.learned.requests} workspace request(s) fall back as learned from "
            + "; ".join(e.text() for e in ts.learned.evidence)
            + (f"; the other {kept} workspace-shaped request(s) are taken as fixed ({why})" if kept else "")
        )
    elif ts.learned is not None:
        unplaced = [e for e in ts.learned.evidence if e.learned]
        notes.append(
            ("the fallible-request evidence given could not be placed on these recordings (another program, or its "
             "stream differs from theirs): " if unplaced else
             "the evidence given shows no request falling back (a calibration whose first failure was fatal, or "
             "that never failed: record one under a cap between the peak allocated and the peak reserved): ")
            + "; ".join(e.text() for e in ts.learned.evidence))
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
            f"fits where 809 does not; with 818 and 836 recorded its laws round as the network does)")
    if cards_asked:
        notes.append(f"cards: the CUDA context is taken as {context // MiB} MiB, not available to the allocator")
    return notes



def _common_step(sizes: Sequence[Fraction]) -> int:
    """The largest whole number every recorded size is a multiple of (1: none, or sizes not whole)."""
    from math import gcd

    if any(x.denominator != 1 for x in sizes):
        return 1
    g = 0
    for x in sizes:
        g = gcd(g, int(x))
    return g
