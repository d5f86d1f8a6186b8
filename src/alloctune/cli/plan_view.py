"""What `alloctune plan` prints: the header, the largest-size, min-budget, at-size and RVC tables.

Kept apart from `cli/plan_cmd.py` so the command module only parses, calls `plan.service.run`
and hands the report here (as `cli/tune_view.py` does for tune).
"""

from __future__ import annotations

from typing import Any

from alloctune.config.standard import setting_label


def render_report(report: Any, *, json_out: bool, torch: str | None = None) -> None:
    """The report as JSON, or its tables (`torch`: the release plan was asked for, repeated in the
    commands it prints)."""
    from alloctune.cli.common import print_json

    if json_out:
        print_json(report.to_dict())
        return
    render_plan(report, torch=torch)


def render_plan(report: Any, *, torch: str | None = None) -> None:
    """Print the plan report: header, saved/exported files, hold-back check and the answer tables."""
    res = report.result
    _header(report, torch)
    confs = [setting_label(s.conf) for s in res.settings]
    if res.settings and res.settings[0].largest:
        _largest_table(res, confs)
    _curve_table(res, confs)
    if res.settings and res.settings[0].at_size:
        _at_size_table(res, confs)
    if report.rvc:
        _rvc_table(report.rvc)
    if report.confirmations:
        _confirm_table(report.confirmations)
    _footer(report)


def _simulate_command(path: str, confs: list[str], torch: str | None) -> str:
    """`alloctune simulate` of an exported stream under plan's settings: it answers plan's min budgets."""
    import shlex

    settings = "" if confs == [""] else "".join(f" --conf {shlex.quote(c)}" for c in confs)
    return f"alloctune simulate {shlex.quote(path)}{settings}" + (f" --torch {torch}" if torch else "") + " --min-budget"


def _header(report: Any, torch: str | None = None) -> None:
    """The recordings and their laws, files written, the hold-back check."""
    from alloctune.cli.common import console
    from alloctune.units import format_size

    res = report.result
    ts = res.traceset
    laws = ", ".join(f"{n} {k}" for k, n in ts["laws"].items())
    console.print(
        f"[bold]{_short(res.workload)}[/bold]: recorded at sizes {', '.join(res.recorded_sizes)}; "
        f"{ts['requests']} requests, "
        + ("same structure at every size" if ts["identical_structure"] else f"{len(ts['variants'])} structures")
        + f"; size laws: {laws}"
    )
    if report.saved:
        console.print(f"trace set saved to [bold]{report.saved}[/bold] ({report.saved_bytes / 1024:.1f} KiB)")
    if report.exported:
        console.print(
            f"generated stream written to [bold]{report.exported}[/bold]; each setting's min budget at "
            "its size, as plan answers it:"
        )
        console.print(
            "  " + _simulate_command(report.exported, [s.conf for s in res.settings], torch), soft_wrap=True, markup=False
        )
    if report.holdout:
        h = report.holdout
        real = f", {h.error_vs_real:+.2%} vs the GPU's peak" if h.error_vs_real is not None else ""
        console.print(
            f"held-back size {h.size} (fitted on {', '.join(h.fitted_on)}): generated stream's peak reserved "
            f"{format_size(h.peak_generated)}, {h.error_vs_replay:+.2%} vs the recording replayed{real}"
            + ("" if h.same_structure else "; structure differs from the recording")
        )


def _largest_cell(x: Any, ceiling: str | None = None) -> str:
    """One answer with its marks (see the legend in `_footer`); `ceiling`: the top of the search."""
    if x.largest is None:
        return "none"
    cell: str = ("≥ " if x.first_failing is None else "") + x.largest + (" *" if x.extrapolated else "")
    if x.bound:
        cell += f" ±{x.bound:.0%}"
    if x.first_failing is None and x.stopped in ("extrapolation", "bound"):
        cell += " ‡"
    if x.optimistic is not None and x.optimistic != x.largest:
        # the optimistic search can only stop where the search does: at its ceiling it is a lower bound
        top = ceiling is not None and x.optimistic == ceiling
        cell += f" .. ≥ {x.optimistic} ‡" if top else f" .. {x.optimistic}"
    if x.completes_again is not None:
        cell += " †"
    if getattr(x, "strict", None) is not None:
        cell += f" (every size ≤ {x.strict})"
    return cell


def _largest_table(res: Any, confs: list[str]) -> None:
    from alloctune.cli.common import console
    from alloctune.cli.render import Col, FitTable

    t = FitTable(
        "target",
        *(Col(c, "right") for c in confs),
        title=f"largest size that completes (search {res.search[0]}..{res.search[1]}, step {res.step})",
    )
    for k, item in enumerate(res.settings[0].largest):
        t.add_row(item.target.label, *[_largest_cell(s.largest[k], str(res.search[1])) for s in res.settings])
    console.print(t)
    _fallible_line(res.fallible)


def _fallible_line(f: dict[str, Any]) -> None:
    """Which evidence decided the workspace requests, or the commands that would make a range one number."""
    from alloctune.cli.common import console

    if not f:
        return
    if f["decided_by"] not in ("none", "recorded fallbacks"):
        console.print(
            f"one number per answer: {f['requests']} workspace request(s) decided by "
            f"{f['decided_by']} (" + "; ".join(e["text"] for e in f["evidence"]) + ")"
        )
    elif f.get("range") and f.get("record"):  # it names the command to run: one line, whatever the width
        from rich.text import Text

        console.print(Text.assemble(("to make each A .. B one number", "bold"), f": {f['record']}"), soft_wrap=True)


def _curve_table(res: Any, confs: list[str]) -> None:
    from alloctune.cli.common import console
    from alloctune.cli.render import Col, FitTable
    from alloctune.units import format_size

    t = FitTable(
        Col("size", "right", True), *(Col(c, "right") for c in confs), title="min budget (peak reserved uncapped) by size"
    )
    for k, p in enumerate(res.settings[0].curve if res.settings else ()):
        cells = []
        for s in res.settings:
            q = s.curve[k]
            mb = format_size(q.min_budget) if q.min_budget is not None else "n/a"
            cells.append(f"{mb} ({format_size(q.peak_reserved)})")
        t.add_row(p.size + (" *" if p.extrapolated else ""), *cells)
    console.print(t)


def _at_size_table(res: Any, confs: list[str]) -> None:
    from alloctune.cli.common import console, warn
    from alloctune.cli.render import Col, FitTable
    from alloctune.units import format_size

    a0 = res.settings[0].at_size
    t = FitTable(
        "setting",
        *(Col(col, "right", True) for col in ("peak reserved", "min budget", "smallest card")),
        *(Col(col, "right") for col in a0.completes),
        title=f"size {a0.size}",
    )
    for s, c in zip(res.settings, confs):
        a = s.at_size
        t.add_row(
            c,
            format_size(a.peak_reserved),
            format_size(a.min_budget) if a.min_budget else "n/a",
            format_size(a.smallest_card) if a.smallest_card else "n/a",
            *["yes" if ok else "OOM" for ok in a.completes.values()],
        )
    console.print(t)
    for n in a0.notes:
        warn(n)


def _rvc_table(rows: Any) -> None:
    from alloctune.cli.common import console
    from alloctune.cli.render import FitTable

    t = FitTable(
        "setting",
        "card",
        "preset",
        "preset chunk s",
        "fits audio s",
        "fits chunk s",
        "verdict",
        title="RVC: the chunk that fits vs RVC's preset",
    )
    for r in rows:
        t.add_row(
            setting_label(r.conf),
            r.target,
            r.preset,
            f"{r.preset_chunk_s:g}",
            f"{r.fits_audio_s:g}" if r.fits_audio_s is not None else "-",
            f"{r.fits_chunk_s:g}" if r.fits_chunk_s is not None else "-",
            r.verdict,
        )
    console.print(t)


def _confirm_table(confirmations: Any) -> None:
    from alloctune.cli.common import console
    from alloctune.cli.render import FitTable

    t = FitTable(
        "setting",
        "target",
        "predicted",
        "confirmed",
        "runs (size: outcome)",
        title="--confirm: predicted vs confirmed on the GPU",
    )
    for c in confirmations:
        t.add_row(
            setting_label(c.conf),
            c.target,
            c.predicted or "-",
            c.confirmed or "none",
            ", ".join(f"{r.size}: {r.outcome}" for r in c.runs) or "-",
        )
    console.print(t)
    for c in confirmations:
        console.print(f"{setting_label(c.conf)} on {c.target}: {c.note}")


def _footer(report: Any) -> None:
    """The figure, the legend, the notes and the time taken."""
    from alloctune.cli.common import console, warn

    res = report.result
    if report.figure:
        console.print(f"figure written to [bold]{report.figure}[/bold]")
    elif report.figure_skipped:
        warn(report.figure_skipped)
    console.print(
        "* outside the recorded sizes (extrapolated); A .. B: conservative .. optimistic (workspaces "
        "fallible); † not monotone: a larger size completes again (see --json completes_again); "
        "(every size ≤ N): sizes between N and the answer fail in the simulation; "
        "±N%: the memory error bound the answer leaves room for; ‡ the search stopped where an "
        "extrapolation means nothing (16x the largest recording, or the bound past 25 %): record a larger size"
    )
    for n in res.notes:
        console.print(f"note: {n}")
    console.print(f"plan took {report.wall_s:.2f} s in all: {res.wall_s:.2f} s answering, {res.replays} simulated replays")


def _short(name: str | None, width: int = 48) -> str:
    """The workload's name for the header (sidecars may hold a whole command line)."""
    if not name:
        return "program"
    return name if len(name) <= width else name[: width - 1] + "…"
