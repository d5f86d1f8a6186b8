"""Where a replay's segment addresses come from, and what a fidelity check therefore measures.

One vocabulary for the CLI (`simulate --addresses`), the Python API, `bench/fidelity.py` and
the tests, because the address source decides what a "reproduced" result is worth: on
torch <= 2.11 the driver's addresses break ties between equal-size free blocks, so a replay
that borrows the addresses of the very recording it is compared with partly confirms itself.

Address sources:
  * `trace`    -- the replayed trace's own recorded addresses (the default: all a user with one
                  recording has);
  * `compared` -- the addresses of the recording the replay is compared with (only on request;
                  the check is then labelled a *replay*, not a prediction);
  * `model`    -- the driver address model alone (nothing recorded is used).

Fidelity kinds (what a check against a recording shows):
  * `replay`    -- the run's own request stream with its own addresses (or another stream with
                   the compared run's addresses): the simulator's rules alone;
  * `prediction from one recording` -- another run's stream and that run's addresses, checked
                   against a run under another setting or cap: what a user predicts;
  * `prediction with modelled addresses` -- any stream, addresses from the model only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from alloctune.trace.model import Trace

if TYPE_CHECKING:
    from alloctune.sim.replay import Addresses

TRACE = "trace"
COMPARED = "compared"
MODEL = "model"
ADDRESS_SOURCES = (TRACE, COMPARED, MODEL)
DEFAULT_SOURCE = TRACE

REPLAY = "replay"
PREDICTION = "prediction from one recording"
MODELLED = "prediction with modelled addresses"
FIDELITY_KINDS = (REPLAY, PREDICTION, MODELLED)


def check_source(source: str) -> str:
    """The source itself, or ValueError naming the accepted words (the CLI turns it into one line)."""
    if source not in ADDRESS_SOURCES:
        raise ValueError(f"address source must be one of {', '.join(ADDRESS_SOURCES)}, not {source!r}")
    return source


def replay_addresses(source: str, trace: Trace, compared: Trace | None = None) -> tuple[Addresses, Trace | None]:
    """`(addresses, reference)` for `sim.replay` under an address source.

    `compared` without a comparison falls back to nothing to borrow from and is refused, so a
    caller never silently gets a different source than it asked for.
    """
    check_source(source)
    if source == MODEL:
        return "model", None
    if source == COMPARED:
        if compared is None:
            raise ValueError("address source 'compared' needs a recording to compare with")
        return "recorded", compared
    return "recorded", trace


def same_recording(a: Trace, b: Trace | None) -> bool:
    """Whether two loaded traces are the same recording (same object or same file and device)."""
    return b is not None and (a is b or (a.source == b.source and a.device == b.device))


def fidelity_kind(source: str, trace: Trace, compared: Trace) -> str:
    """What a check of `trace`'s replay against `compared` shows, given the address source."""
    check_source(source)
    if source == MODEL:
        return MODELLED
    if source == COMPARED or same_recording(trace, compared):
        return REPLAY
    return PREDICTION
