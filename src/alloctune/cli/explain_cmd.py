"""`alloctune explain REC [--against A]`: where the memory goes at the peak (or OOM, or --at)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("explain")
    def explain(
        recordings: List[Path] = typer.Argument(
            ..., metavar="RECORDING...",
            help="Snapshot (.pickle[.gz|.xz]) or compact trace; several: the ranks of one job (NAME.rankN.pickle)."),
        against: Optional[Path] = typer.Option(
            None, "--against", metavar="RECORDING", help="Split the gap in peak reserved to this recording by site and category."),
        at: Optional[str] = typer.Option(
            None, "--at", metavar="EVENT|SECONDSs", help="Event index, or a time like 12.5s (default: OOM, else peak reserved)."),
        group: str = typer.Option("line", "--group", metavar="line|function|file|module", help="How sites are grouped."),
        top: int = typer.Option(20, "--top", metavar="N", help="Sites listed (the rest are summed in one row)."),
        what_if: bool = typer.Option(True, "--what-if/--no-what-if", help="Simulate the min budget with each kept site freed."),
        what_if_dir: Optional[Path] = typer.Option(
            None, "--what-if-dir", metavar="DIR", help="Write each what-if's rewritten recording here (for alloctune simulate)."),
        device: Optional[int] = typer.Option(None, "--device", "-d", metavar="N", help="Device index (needed if several recorded)."),
        json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
        calibration: Optional[List[Path]] = typer.Option(
            None, "--calibration", metavar="FILE",
            help="A recording of the same program and input run under a cap (alloctune run --budget ... --record): "
            "the fallbacks it shows (cuDNN giving workspaces up) make the min budgets those of a capped run."),
        html_out: Optional[Path] = typer.Option(
            None, "--html", metavar="FILE", help="Also write one self-contained HTML page (over time, map, what-ifs)."),
    ) -> None:
        """Where the memory goes: categories that sum exactly to reserved memory, sites (your line and the
        library frame), growth per repetition, and simulated what-ifs."""
        from alloctune import api
        from alloctune.cli.render import err_console
        from alloctune.errors import InputError
        from alloctune.progress import progress_on_stderr

        if calibration and (len(recordings) > 1 or against is not None):
            raise InputError("--calibration takes one recording (the program's, uncapped), not ranks or --against")
        if len(recordings) > 1:
            if against is not None or at is not None:
                raise InputError("--against and --at take one recording; several recordings are the ranks of one job")
            imb = api.explain(recordings, group=group, top=top)
            if json_out:
                from alloctune.cli.common import print_json

                print_json(imb.to_dict())
            else:
                _render_ranks(imb)
            return
        recording = recordings[0]

        at_value: object = at
        if at is not None and not at.strip().endswith("s"):
            try:
                at_value = int(at)
            except ValueError:
                raise InputError(f"--at {at!r}: expected an event index or a time like 12.5s") from None
        if against is not None and html_out is not None:
            from alloctune.errors import InputError

            raise InputError("--html writes the page of one recording; drop --against or --html")
        if against is not None:
            cmp = api.explain(recording, against=against, group=group, top=top, device=device)
            if json_out:
                from alloctune.cli.common import print_json

                print_json(cmp.to_dict())
            else:
                _render_against(cmp)
            return
        if html_out is not None:  # the explanation and its page from one load
            from alloctune.report.explain_html import write_explain_html

            with progress_on_stderr(quiet=json_out, console=err_console) as progress:
                ex = write_explain_html(recording, html_out, at=at_value, group=group, top=top, what_if=what_if,
                                        what_if_dir=what_if_dir, device=device, progress=progress,
                                        calibrations=list(calibration or []))
        else:
            with progress_on_stderr(quiet=json_out, console=err_console) as progress:
                ex = api.explain(recording, at=at_value, group=group, top=top, what_if=what_if,
                                 what_if_dir=what_if_dir, device=device, progress=progress,
                                 calibrations=list(calibration or []))
        if json_out:
            from alloctune.cli.common import print_json

            print_json(ex.to_dict())
        else:
            _render(ex)
            if html_out is not None:
                from alloctune.cli.render import console

                console.print(f"wrote {html_out}", markup=False, soft_wrap=True)


def _fmt(n: int | None) -> str:
    from alloctune.units import format_size

    return "-" if n is None else format_size(n) if n >= 0 else "-" + format_size(-n)


def _render(ex) -> None:  # ex: Explanation
    from alloctune.cli.render import console

    mo = ex.moment
    console.print(f"{ex.source}: {mo['reason']} at event {mo['event']}: reserved {_fmt(mo['reserved'])}, "
                  f"allocated {_fmt(mo['allocated'])}", markup=False)
    for c in ex.categories:
        share = 100.0 * c.bytes / ex.reserved if ex.reserved else 0.0
        console.print(f"  {c.name:<16} {_fmt(c.bytes):>12} {share:5.1f} %  {c.how}", markup=False, soft_wrap=True)
    console.print(f"repetitions: {ex.repeats['count']} ({ex.repeats['how']})", markup=False)
    console.print("sites (live bytes at the moment; kept = outlived its repetition):", markup=False)
    for s in ex.sites:
        grow = f", grows {_fmt(s.bytes_per_repeat)}/repetition" if s.growing else ""
        freed = f", min budget if freed {_fmt(s.min_budget_if_freed)}" if s.min_budget_if_freed is not None else ""
        lib = f"  [{s.library_frame}]" if s.library_frame else ""
        console.print(f"  {_fmt(s.bytes):>12} in {s.blocks} blocks, kept {_fmt(s.outlived_bytes)}{grow}{freed}  "
                      f"{s.site}{lib}", markup=False, soft_wrap=True)
    if ex.min_budget is not None:
        console.print(f"min budget of the recording as it ran: {_fmt(ex.min_budget)}", markup=False)
    for w in ex.what_if:
        console.print(f"  what if: {w.what}: {_fmt(w.min_budget)} (saves {_fmt(w.saves)})", markup=False, soft_wrap=True)
        console.print(f"    {w.command.splitlines()[-1]}", markup=False, soft_wrap=True)
    _render_remedies(ex)
    for note in ex.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)


def _render_remedies(ex) -> None:  # ex: Explanation
    """Each remedy with what it buys and how to get it, then the utilization table (#29.5, #29.6)."""
    from alloctune.cli.render import console
    from alloctune.explain.utilization import render_lines

    if ex.remedies:
        console.print("remedies (program-level, on this recording):", markup=False)
    for r in ex.remedies:
        if r.min_budget is None:
            bound = f", at best {_fmt(r.bound)} (simulated bound)" if r.bound is not None else ""
            console.print(f"  {r.name}: {r.what}: {r.method}{bound} -- {r.how_to}", markup=False, soft_wrap=True)
            if r.confirm:
                console.print(f"    confirm: {r.confirm}", markup=False, soft_wrap=True)
            continue
        change = ("no change" if not r.saving else f"saves {_fmt(r.saving)}" if r.saving > 0
                  else f"costs {_fmt(-r.saving)}")
        calls = f", {r.extra_driver_calls} more driver calls (at most {r.extra_seconds * 1e3:.0f} ms)" \
            if r.extra_driver_calls else ""
        console.print(f"  {r.name}: min budget {_fmt(r.min_budget)} ({change}, {r.method}){calls} -- {r.how_to}",
                      markup=False, soft_wrap=True)
    if ex.utilization is not None:
        console.print("utilization (peak allocated / peak reserved, uncapped) and min budget:", markup=False)
        for line in render_lines(ex.utilization):
            console.print(line, markup=False, soft_wrap=True)


def _render_against(cmp) -> None:  # cmp: Comparison
    from alloctune.cli.render import console

    console.print(f"{cmp.this.source} vs {cmp.other.source}: peak reserved gap {_fmt(cmp.gap)}", markup=False)
    for name, d in cmp.categories.items():
        console.print(f"  {name:<16} {_fmt(d):>12}", markup=False)
    console.print("sites (delta of live bytes at the two peaks):", markup=False)
    for s in cmp.sites:
        console.print(f"  {_fmt(s.delta):>12}  {s.site}", markup=False, soft_wrap=True)
    for site, d in cmp.other_only:
        console.print(f"  {_fmt(d):>12}  {site} (only in {cmp.other.source})", markup=False, soft_wrap=True)


def _render_ranks(imb) -> None:  # imb: RankImbalance
    from alloctune.cli.render import console

    heads = "  ".join(f"{'rank ' + str(r):>12}" for r in imb.ranks)
    console.print(f"{'':<16} {heads}  {'spread':>12}", markup=False)
    console.print(f"{'reserved':<16} " + "  ".join(f"{_fmt(e.reserved):>12}" for e in imb.explanations)
                  + f"  {_fmt(max(e.reserved for e in imb.explanations) - min(e.reserved for e in imb.explanations)):>12}",
                  markup=False)
    for name, vals in imb.categories.items():
        console.print(f"{name:<16} " + "  ".join(f"{_fmt(v):>12}" for v in vals) + f"  {_fmt(max(vals) - min(vals)):>12}",
                      markup=False)
    console.print("sites (largest spread first):", markup=False)
    for site, vals in imb.sites:
        console.print("  " + "  ".join(f"{_fmt(v):>12}" for v in vals) + f"  {_fmt(max(vals) - min(vals)):>12}  {site}",
                      markup=False, soft_wrap=True)
