"""The one min-budget resolution of every command.

A min budget is found by bisection, which stops when the bracket is within `REL_TOL` of the
budget or `ABS_TOL` bytes, whichever is larger. `simulate --min-budget`, `explain`'s what-ifs and
remedies, `tune`'s estimates and `plan` all stop there, so a number one command prints is the
number the command it prints as its reproduction answers; and a remedy's saving -- often a few
percent -- is finer than a coarser step would show. Its own module (units only) so that the tune
core, which imports the simulator lazily, can name it cheaply.
"""

from __future__ import annotations

from alloctune.units import MiB

REL_TOL = 0.002
ABS_TOL = 1 * MiB


def step(budget: int, rel_tol: float = REL_TOL, abs_tol: int = ABS_TOL) -> int:
    """The bracket width at which a bisection near `budget` stops: two budgets closer than this are one
    answer to it."""
    return max(abs_tol, int(rel_tol * budget))
