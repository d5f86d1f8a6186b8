"""`alloctune plan INPUTS... [--card 6GiB] [--cap 3GiB] [--conf ...] [--size N]`: what fits where.

Parses, calls `alloctune.plan.service.run`, renders. INPUTS: a saved trace set
(`.atraceset`), or recordings `FILE:SIZE` (torch `_dump_snapshot` pickles or alloctune
traces; `FILE` alone when its sidecar names the size; a directory from `record --size`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer


def _sizes(values: list[str] | None) -> list[int]:
    from alloctune.units import parse_size

    out = []
    for v in values or []:
        out.extend(parse_size(p.strip()) for p in v.split(",") if p.strip())
    return out


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        inputs: List[str] = typer.Argument(..., metavar="INPUTS...", help="TRACESET.atraceset, or FILE:SIZE ... "
                                           "(two or more sizes), or a directory written by record --size"),
        card: Optional[List[str]] = typer.Option(None, "--card", help="card memory, e.g. 6GiB (repeatable, or 4GB,8GB)"),
        cap: Optional[List[str]] = typer.Option(None, "--cap", help="per-process cap on the recording's device "
                                                "(set_per_process_memory_fraction), e.g. 3GiB; repeatable"),
        conf: Optional[List[str]] = typer.Option(None, "--conf", "-c", help="allocator setting (repeatable); "
                                                 "default: unset"),
        size: Optional[str] = typer.Option(None, "--size", help="answer for this input size: peak reserved, "
                                           "completes per card/cap, min budget, smallest card"),
        step: Optional[str] = typer.Option(None, "--step", help="size grid of the search (default 1 for whole sizes)"),
        max_size: Optional[str] = typer.Option(None, "--max-size", help="top of the search (default 4x the largest "
                                               "recorded size)"),
        curve: Optional[str] = typer.Option(None, "--curve", help="sizes for the min-budget table, e.g. 8,16,32"),
        save: Optional[Path] = typer.Option(None, "--save", help="write the size-parametric trace set here "
                                            "(.atraceset)"),
        hold_back: Optional[str] = typer.Option(None, "--hold-back", help="check the fit on the recording at this "
                                                "size: fit on the others, compare peak reserved"),
        export: Optional[str] = typer.Option(None, "--export", help="write the stream generated at SIZE as an "
                                             "alloctune trace: SIZE:FILE (then alloctune simulate FILE)"),
        png: Optional[Path] = typer.Option(None, "--png", help="min budget vs size figure (needs matplotlib)"),
        rvc: bool = typer.Option(False, "--rvc", help="set the answers against RVC's chunk presets (sizes = audio "
                                 "seconds of one unsplit file)"),
        rvc_pad: float = typer.Option(3.0, "--rvc-pad", help="x_pad (s) the RVC recordings were made with"),
        context: str = typer.Option("518MiB", "--context", help="CUDA context on a card, not available to the "
                                    "allocator"),
        torch_version: Optional[str] = typer.Option(None, "--torch", help="PyTorch release whose rules to apply"),
        json_out: bool = typer.Option(False, "--json", help="print machine-readable JSON"),
    ) -> None:
        """Largest input size per card/cap and setting, min budget vs size, and the card one size needs.

        Example: `alloctune plan rvc-*.pickle.xz --card 4GB,6GB,8GB --conf expandable_segments:True --rvc`
        or `alloctune plan a.pickle:1024 b.pickle:2048 c.pickle:4096 --card 3GiB --size 3000`.
        """
        from alloctune.cli.common import err_console, print_json
        from alloctune.errors import InputError
        from alloctune.plan.service import run
        from alloctune.units import parse_size

        if not card and not cap and size is None and not json_out and save is None and png is None:
            card = ["4GiB", "8GiB", "16GiB", "24GiB"]
        if png is not None and not png.parent.exists():
            raise InputError(f"--png: directory {str(png.parent)!r} does not exist")
        if save is not None and not save.parent.exists():
            raise InputError(f"--save: directory {str(save.parent)!r} does not exist")
        live = not json_out and err_console.is_terminal
        progress = (lambda msg: err_console.print(f"[dim]{msg:<70.70}[/dim]", end="\r")) if live else None
        report = run(
            inputs,
            save=save,
            hold_back=hold_back,
            export=export,
            png=png,
            rvc=rvc,
            rvc_pad=rvc_pad,
            confs=list(conf or [""]),
            cards=_sizes(card),
            caps=_sizes(cap),
            size=size,
            step=step,
            max_size=max_size,
            curve=[c for c in curve.split(",") if c.strip()] if curve else None,
            torch=torch_version,
            context=parse_size(context),
            progress=progress,
        )
        if json_out:
            print_json(report.to_dict())
        else:
            if live:
                err_console.print(" " * 70, end="\r")
            _render(report)


def _render(report: Any) -> None:
    from rich.table import Table

    from alloctune.cli.common import console, warn
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
        console.print(f"generated stream written to [bold]{report.exported}[/bold] (alloctune simulate reads it)")
    if report.holdout:
        h = report.holdout
        real = f", {h.error_vs_real:+.2%} vs the GPU's peak" if h.error_vs_real is not None else ""
        console.print(
            f"held-back size {h.size} (fitted on {', '.join(h.fitted_on)}): generated stream's peak reserved "
            f"{format_size(h.peak_generated)}, {h.error_vs_replay:+.2%} vs the recording replayed{real}"
            + ("" if h.same_structure else "; structure differs from the recording")
        )
    confs = [s.conf or "(unset)" for s in res.settings]
    if res.settings and res.settings[0].largest:
        t = Table(title=f"largest size that completes (search {res.search[0]}..{res.search[1]}, step {res.step})")
        t.add_column("target")
        for c in confs:
            t.add_column(c, justify="right")
        for k, item in enumerate(res.settings[0].largest):
            cells = []
            for s in res.settings:
                x = s.largest[k]
                if x.largest is None:
                    cells.append("none")
                else:
                    cell = ("≥ " if x.first_failing is None else "") + x.largest + (" *" if x.extrapolated else "")
                    if x.optimistic is not None and x.optimistic != x.largest:
                        cell += f" .. {x.optimistic}"
                    if x.completes_again is not None:
                        cell += " †"
                    cells.append(cell)
            t.add_row(item.target.label, *cells)
        console.print(t)
    t = Table(title="min budget (peak reserved uncapped) by size")
    t.add_column("size", justify="right")
    for c in confs:
        t.add_column(c, justify="right")
    for k, p in enumerate(res.settings[0].curve if res.settings else ()):
        cells = []
        for s in res.settings:
            q = s.curve[k]
            mb = format_size(q.min_budget) if q.min_budget is not None else "n/a"
            cells.append(f"{mb} ({format_size(q.peak_reserved)})")
        t.add_row(p.size + (" *" if p.extrapolated else ""), *cells)
    console.print(t)
    if res.settings and res.settings[0].at_size:
        a0 = res.settings[0].at_size
        t = Table(title=f"size {a0.size}")
        for col in ("setting", "peak reserved", "min budget", "smallest card", *a0.completes):
            t.add_column(col, justify="right")
        for s, c in zip(res.settings, confs):
            a = s.at_size
            t.add_row(c, format_size(a.peak_reserved), format_size(a.min_budget) if a.min_budget else "n/a",
                      format_size(a.smallest_card) if a.smallest_card else "n/a",
                      *["yes" if ok else "OOM" for ok in a.completes.values()])
        console.print(t)
        for n in a0.notes:
            warn(n)
    if report.rvc:
        t = Table(title="RVC: the chunk that fits vs RVC's preset")
        for col in ("setting", "card", "preset", "preset chunk s", "fits audio s", "fits chunk s", "verdict"):
            t.add_column(col)
        for r in report.rvc:
            t.add_row(r.conf or "(unset)", r.target, r.preset, f"{r.preset_chunk_s:g}",
                      f"{r.fits_audio_s:g}" if r.fits_audio_s is not None else "-",
                      f"{r.fits_chunk_s:g}" if r.fits_chunk_s is not None else "-", r.verdict)
        console.print(t)
    if report.figure:
        console.print(f"figure written to [bold]{report.figure}[/bold]")
    elif report.figure_skipped:
        warn(report.figure_skipped)
    console.print("* outside the recorded sizes (extrapolated); A .. B: conservative .. optimistic (workspaces "
                  "fallible); † not monotone: a larger size completes again (see --json completes_again)")
    for n in res.notes:
        console.print(f"note: {n}")
    console.print(f"plan took {report.wall_s:.2f} s in all: {res.wall_s:.2f} s answering, "
                  f"{res.replays} simulated replays")


def _short(name: str | None, width: int = 48) -> str:
    """The workload's name for the header (sidecars may hold a whole command line)."""
    if not name:
        return "program"
    return name if len(name) <= width else name[: width - 1] + "…"
