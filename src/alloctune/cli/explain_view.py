"""The text views of `alloctune explain`: one recording, a comparison, the ranks of a job."""

from __future__ import annotations

from alloctune.explain.model import Comparison, Explanation, RankImbalance


def phase_lines(ex: Explanation) -> list[str]:
    """Which phase and step the moment falls in, and the live bytes by the phase that made them."""
    mo = ex.moment
    if not ex.phases:
        return []
    step = f" of step {mo['step']} of {mo['steps']}" if "step" in mo else ""
    total = sum(p.bytes for p in ex.phases) or 1
    parts = ", ".join(f"{p.name} {_fmt(p.bytes)} ({100.0 * p.bytes / total:.0f} %)" for p in ex.phases if p.bytes)
    return [
        f"the {ex.moment_name} falls in the {mo['phase'].replace('_', ' ')}{step}",
        f"allocated by the phase that made it: {parts}",
    ]


def _fmt(n: int | None) -> str:
    from alloctune.units import format_size

    return "-" if n is None else format_size(n) if n >= 0 else "-" + format_size(-n)


def render(ex: Explanation) -> None:
    from alloctune.cli.render import console

    mo = ex.moment
    console.print(
        f"{ex.source}: {ex.moment_name} at event {mo['event']}: reserved {_fmt(mo['reserved'])}, "
        f"allocated {_fmt(mo['allocated'])}",
        markup=False,
    )
    for line in phase_lines(ex):
        console.print(line, markup=False, soft_wrap=True)
    for c in ex.categories:
        share = 100.0 * c.bytes / ex.reserved if ex.reserved else 0.0
        console.print(f"  {c.name:<16} {_fmt(c.bytes):>12} {share:5.1f} %  {c.how}", markup=False, soft_wrap=True)
    console.print(f"repetitions: {ex.repeats['count']} ({ex.repeats['how']})", markup=False)
    console.print("sites (live bytes at the moment; kept = outlived its repetition):", markup=False)
    for s in ex.sites:
        grow = f", grows {_fmt(s.bytes_per_repeat)}/repetition" if s.growing else ""
        freed = f", min budget if freed {_fmt(s.min_budget_if_freed)}" if s.min_budget_if_freed is not None else ""
        lib = f"  [{s.library_frame}]" if s.library_frame else ""
        if s.model_frame and s.model_frame != s.site:
            lib = f"  model: {s.model_frame}{lib}"
        console.print(
            f"  {_fmt(s.bytes):>12} in {s.blocks} blocks, kept {_fmt(s.outlived_bytes)}{grow}{freed}  {s.site}{lib}",
            markup=False,
            soft_wrap=True,
        )
    if ex.min_budget is not None:
        low = f"{_fmt(ex.min_budget_floor)} .. " if ex.min_budget_floor is not None else ""
        console.print(f"min budget of the recording as it ran: {low}{_fmt(ex.min_budget)}", markup=False)
        if ex.min_budget_floor is not None:
            console.print(
                "  A .. B: workspace-shaped requests given up .. as recorded (cuDNN may give them up under a "
                "cap; a run under one with --record, given as --calibration, settles where)",
                markup=False,
                soft_wrap=True,
            )
    for w in ex.what_if:
        console.print(f"  what if: {w.what}: {_fmt(w.min_budget)} (saves {_fmt(w.saves)})", markup=False, soft_wrap=True)
        for line in w.command.splitlines():  # the step that writes the rewritten recording, then its replay
            console.print(f"    {line}", markup=False, soft_wrap=True)
    render_remedies(ex)
    for note in ex.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)


def render_remedies(ex: Explanation) -> None:
    """Each remedy with what it buys and how to get it, then the utilization table (#29.5, #29.6)."""
    from alloctune.cli.render import console
    from alloctune.cli.views import print_utilization

    if ex.remedies:
        console.print("remedies (program-level, on this recording):", markup=False)
    for r in ex.remedies:
        if r.min_budget is None:
            bound = f", at best {_fmt(r.bound)} (simulated bound)" if r.bound is not None else ""
            console.print(f"  {r.name}: {r.what}: {r.method}{bound} -- {r.how_to}", markup=False, soft_wrap=True)
            if r.confirm:
                console.print(f"    confirm: {r.confirm}", markup=False, soft_wrap=True)
            continue
        change = "no change" if not r.saving else f"saves {_fmt(r.saving)}" if r.saving > 0 else f"costs {_fmt(-r.saving)}"
        calls = (
            f", {r.extra_driver_calls} more driver calls (at most {r.extra_seconds * 1e3:.0f} ms)" if r.extra_driver_calls else ""
        )
        low = f"{_fmt(r.bound)} .. " if r.bound is not None and r.bound < r.min_budget else ""
        console.print(
            f"  {r.name}: min budget {low}{_fmt(r.min_budget)} ({change}, {r.method}){calls} -- {r.how_to}",
            markup=False,
            soft_wrap=True,
        )
    if ex.utilization is not None:
        console.print("utilization (peak allocated / peak reserved, uncapped) and min budget:", markup=False)
        print_utilization(console, ex.utilization)


def render_against(cmp: Comparison) -> None:
    from alloctune.cli.render import console

    console.print(f"{cmp.this.source} vs {cmp.other.source}: peak reserved gap {_fmt(cmp.gap)}", markup=False)
    for name, d in cmp.categories.items():
        console.print(f"  {name:<16} {_fmt(d):>12}", markup=False)
    console.print("sites (delta of live bytes at the two peaks):", markup=False)
    for s in cmp.sites:
        console.print(f"  {_fmt(s.delta):>12}  {s.site}", markup=False, soft_wrap=True)
    for site, d in cmp.other_only:
        console.print(f"  {_fmt(d):>12}  {site} (only in {cmp.other.source})", markup=False, soft_wrap=True)


def render_ranks(imb: RankImbalance) -> None:
    from alloctune.cli.render import console

    heads = "  ".join(f"{'rank ' + str(r):>12}" for r in imb.ranks)
    console.print(f"{'':<16} {heads}  {'spread':>12}", markup=False)
    console.print(
        f"{'reserved':<16} "
        + "  ".join(f"{_fmt(e.reserved):>12}" for e in imb.explanations)
        + f"  {_fmt(max(e.reserved for e in imb.explanations) - min(e.reserved for e in imb.explanations)):>12}",
        markup=False,
    )
    for name, vals in imb.categories.items():
        console.print(
            f"{name:<16} " + "  ".join(f"{_fmt(v):>12}" for v in vals) + f"  {_fmt(max(vals) - min(vals)):>12}", markup=False
        )
    console.print("sites (largest spread first):", markup=False)
    for site, vals in imb.sites:
        console.print(
            "  " + "  ".join(f"{_fmt(v):>12}" for v in vals) + f"  {_fmt(max(vals) - min(vals)):>12}  {site}",
            markup=False,
            soft_wrap=True,
        )
