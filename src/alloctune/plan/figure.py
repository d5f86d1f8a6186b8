"""Min budget and peak reserved as a function of input size (PNG, when matplotlib is there).

The figure names what it rests on: simulated replays of streams generated from the
recorded sizes (marked), per setting; extrapolated sizes are drawn dashed.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from alloctune.config.standard import setting_label
from alloctune.plan.result import PlanResult
from alloctune.units import GiB


def budget_figure(result: PlanResult, path: str | Path) -> str | None:
    """Write the PNG; returns None, or why it was skipped (matplotlib missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'alloctune[plot]'); no figure written"
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    recorded = [float(s) for s in result.recorded_sizes]
    for s in result.settings:
        xs = [float(p.size) for p in s.curve if p.min_budget is not None]
        ys = [p.min_budget / GiB for p in s.curve if p.min_budget is not None]
        (line,) = ax.plot(xs, ys, marker="o", label=f"min budget, {setting_label(s.conf)}")
        ax.plot(
            [float(p.size) for p in s.curve],
            [p.peak_reserved / GiB for p in s.curve],
            linestyle=":",
            color=line.get_color(),
            label=f"peak reserved uncapped, {setting_label(s.conf)}",
        )
    for x in recorded:
        ax.axvline(x, color="0.85", linewidth=0.8, zorder=0)
    if recorded:
        ax.axvspan(max(recorded), ax.get_xlim()[1], color="0.95", zorder=0, label="extrapolated")
    ax.set_xlabel("input size" + (f" ({result.workload})" if result.workload else ""))
    ax.set_ylabel("GiB")
    ax.set_title("Memory needed vs input size — exact allocator simulation", fontsize=10)
    note = (
        f"From recordings at sizes {', '.join(result.recorded_sizes)} (grey lines): a request stream generated "
        "per size from exact size laws, replayed by alloctune's allocator simulator"
        + ("; conservative (no fallible-request model)." if result.conservative else ".")
    )
    fig.text(0.01, 0.01, "\n".join(textwrap.wrap(note, 130)), fontsize=7)
    ax.legend(fontsize=7)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return None
