"""What `alloctune tune` prints: the live trial lines, the trials table and the recommendation.

Kept apart from `cli/tune_cmd.py` so the command module only parses, calls `tune.session`
and hands the outcome here (as `cli/views.py` does for snapshots).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from alloctune.config.standard import setting_label


def _fmt(n: Optional[int]) -> str:
    from alloctune.units import format_size

    return "-" if n is None else format_size(n)


def _budget(n: Optional[int]) -> str:
    return "no budget" if n is None else _fmt(n)


def _outcome(outcome: str) -> str:
    colour = _COLOURS.get(outcome, "white")
    return f"[{colour}]{outcome}[/{colour}]"


def _measured(s: Any) -> str:
    if s.min_budget is None:
        return "-" if s.feasible is None else ("fits" if s.feasible else "no fit")
    return _fmt(s.min_budget)


def _rate(s: Any) -> str:
    if s.throughput is None:
        return "-"
    if s.throughput_noise is None:
        return f"{s.throughput:.3g} (n=1)" if s.throughput_samples else f"{s.throughput:.3g}"
    return f"{s.throughput:.3g} ± {s.throughput_noise:.2g}"


def render_trials(trials: Any, title: str = "trials") -> None:
    from rich.text import Text

    from alloctune.cli.common import console
    from alloctune.cli.render import Col, FitTable

    t = FitTable(
        Col("#", justify="right", nowrap=True),
        "setting",
        Col("budget", nowrap=True),
        "outcome",
        Col("peak\nreserved", justify="right", nowrap=True),
        Col("OOMs", justify="right", nowrap=True),
        "why",
        title=title,
    )
    mismatched = []
    for i, rec in enumerate(trials, 1):
        r = rec.result
        setting = setting_label(r.conf)
        if r.warnings:  # the allocator did not run with what was asked: the trial is refused
            setting += " (!)"
            mismatched.append(f"#{i}: {'; '.join(r.warnings)}")
        t.add_row(
            f"{i}{'*' if rec.reused else ''}",
            setting,
            _budget(r.budget),
            Text(r.outcome, style=_COLOURS.get(r.outcome, "")),
            _fmt(r.peak_reserved),
            "-" if r.num_ooms is None else str(r.num_ooms),
            rec.purpose,
        )
    console.print(t)
    for line in mismatched:
        console.print(Text(f"(!) {line}", style="yellow"))
    if any(rec.reused for rec in trials):
        console.print("[dim]* taken from the results store (--resume)[/dim]")


_COLOURS = {"ok": "green", "oom": "red", "crash": "red", "timeout": "yellow"}


def _simulated(s: Any) -> str:
    """The simulated min_budget, as a range when giving up workspaces would change it."""
    if s.sim_optimistic is None or s.sim_min_budget is None:
        return _fmt(s.sim_min_budget)
    return f"{_fmt(s.sim_optimistic)}–{_fmt(s.sim_min_budget)}"


def render_result(result: Any, rec: Any, store: Path, elapsed: float) -> None:
    from rich.text import Text

    from alloctune.cli.common import console
    from alloctune.cli.render import Col, FitTable

    render_trials(result.trials)
    t = FitTable(
        "setting",
        Col("simulated", nowrap=True),
        Col("measured", nowrap=True),
        "verified",
        "throughput",
        Col("runs", justify="right", nowrap=True),
        title=f"candidates at the budget {_fmt(result.budget)}",
    )
    best = result.ranking.best
    why = []
    for s in result.ranking.order:
        verdict = "recommended" if s is best else result.ranking.reasons.get(s.candidate.conf, "")
        why.append((s.candidate.label, verdict, s is best))
        t.add_row(
            Text(s.candidate.label, style="bold green") if s is best else s.candidate.label,
            _simulated(s),
            _measured(s),
            "-" if s.verified is None else ("yes" if s.verified else "no"),
            _rate(s),
            str(s.trials),
        )
    console.print(t)
    console.print(
        "[dim]simulated / measured: smallest working budget (measured = a tested pass; "
        "verified = a tested failure just below it: within 2 % or 4 MiB, exhaustive 1 % or 16 MiB)[/dim]"
    )
    for label, text, chosen in why:
        console.print(Text.assemble(("→ " if chosen else "- ", "bold green" if chosen else ""), f"{label}: {text}"))
    for note in result.notes:
        console.print(Text(f"note: {note}"))
    render_remedies(result)
    console.print(f"\n[bold]{rec.summary}[/bold]")
    sf = getattr(result, "shortfall", None)
    if sf is not None and sf.next_steps:
        console.print("next:")
        for step in sf.next_steps:  # a step names the command to run: one line, whatever the width
            console.print(f"  - {step}", markup=False, soft_wrap=True)
    for shell, text in rec.lines.items():
        console.print(f"[dim]{shell}:[/dim]")
        for line in text.splitlines():
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    fresh = result.fresh_trials
    after = result.to_dict()["gpu_runs_after_baseline"]
    busy = f", {result.in_runs_s:.1f} s of them with a run going" if fresh else ""
    console.print(
        f"\n{len(result.trials)} trials ({fresh} run, {after} after the baseline, {len(result.trials) - fresh} from "
        f"the store) in {elapsed:.0f} s{busy}; store: {store}"
    )


def render_remedies(result: Any) -> None:
    """The program-level remedies beside the settings and the utilization table (#29)."""
    from rich.text import Text

    from alloctune.cli.common import console
    from alloctune.cli.views import print_utilization

    rep = getattr(result, "remedies", None)
    if rep is None or (not rep.remedies and rep.utilization is None):
        return
    if rep.remedies:
        console.print("remedies (program-level, beside the setting):")
    for r in rep.remedies:
        mark = "→ " if r is rep.best_release else "- "
        if r.min_budget is None:
            bound = f", at best {_fmt(r.bound)} (simulated bound)" if r.bound is not None else ""
            head = f"{r.name}: {r.method}{bound}"
        else:
            change = "no change" if not r.saving else (f"saves {_fmt(r.saving)}" if r.saving > 0 else f"costs {_fmt(-r.saving)}")
            head = f"{r.name}: min budget {_fmt(r.min_budget)} ({change}, {r.method})"
        console.print(f"  {mark}{head} -- {r.how_to}", markup=False, soft_wrap=True)  # how_to is code to copy
        if r.method != "simulated" and r.notes:
            console.print(Text(f"      {r.notes[0]}"))
        if r.confirm and r.min_budget is None:
            console.print(f"      confirm: {r.confirm}", markup=False, soft_wrap=True)
    if rep.utilization is not None:
        console.print("utilization (peak allocated / peak reserved of the uncapped replay) and min budget:")
        print_utilization(console, rep.utilization)
