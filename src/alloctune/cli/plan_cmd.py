"""`alloctune plan INPUTS... [--card 6GiB] [--budget 3GiB] [--conf ...] [--size N]`: what fits where.

Parses, calls `alloctune.plan.service.run`, renders through `cli/plan_view.py`. INPUTS: a saved trace set
(`.atraceset`), or recordings `FILE:SIZE` (torch `_dump_snapshot` pickles or alloctune
traces; `FILE` alone when its sidecar names the size; a directory from `record --size`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer

# The cards answered for when nothing else is asked (no --card, --budget, --size, --save, --png or --json)
DEFAULT_CARDS = ("4GiB", "8GiB", "16GiB", "24GiB")


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        inputs: List[str] = typer.Argument(..., metavar="INPUTS...", help="TRACESET.atraceset, or FILE:SIZE ... "
                                           "(two or more sizes), or a directory written by record --size"),
        card: Optional[List[str]] = typer.Option(None, "--card", help="card memory, e.g. 6GiB (repeatable, or 4GiB,8GiB)"),
        budget: Optional[List[str]] = typer.Option(None, "--budget", "-b", help="per-process budget on the "
                                                   "recording's device (set_per_process_memory_fraction), e.g. "
                                                   "3GiB; repeatable, or 2GiB,3GiB"),
        cap: Optional[List[str]] = typer.Option(None, "--cap", hidden=True, help="the old name of --budget"),
        conf: Optional[List[str]] = typer.Option(None, "--conf", "-c", help="allocator setting (repeatable); "
                                                 "default: unset"),
        size: Optional[str] = typer.Option(None, "--size", help="answer for this input size: peak reserved, "
                                           "completes per card/budget, min budget, smallest card"),
        step: Optional[str] = typer.Option(None, "--step", help="size grid of the search (default 1 for whole sizes)"),
        max_size: Optional[str] = typer.Option(None, "--max-size", help="top of the search (default: open-ended, "
                                               "doubling until the size fails, at most 16x the largest recorded size)"),
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
        confirm: Optional[str] = typer.Option(None, "--confirm", help="run this program (quoted, {size} where the "
                                              "input size goes) at each predicted largest size under the target's "
                                              "budget; on a failure step down by the bound and run once more"),
        confirm_runs: int = typer.Option(2, "--confirm-runs", help="runs per answer for --confirm, at most"),
        calibration: Optional[List[str]] = typer.Option(None, "--calibration", help="a capped run of the program "
                                                        "whose workspaces fell back, FILE[:SIZE] (repeatable): "
                                                        "which requests it gives up, so each answer is one number"),
        store: Optional[Path] = typer.Option(None, "--store", help="a tune store of the same program: its capped "
                                             "recorded runs teach the fallbacks, as --calibration does"),
        json_out: bool = typer.Option(False, "--json", help="print machine-readable JSON"),
    ) -> None:
        """Largest input size per card/budget and setting, min budget vs size, and the card one size needs.

        Example: `alloctune plan rvc-*.pickle.xz --card 4GiB,6GiB,8GiB --conf expandable_segments:True --rvc`

        Or: `alloctune plan a.pickle:1024 b.pickle:2048 c.pickle:4096 --card 3GiB --size 3000`
        """
        from alloctune.cli.plan_view import render_report
        from alloctune.cli.render import err_console
        from alloctune.errors import InputError
        from alloctune.plan.confirm import command_words
        from alloctune.plan.inputs import parse_sizes
        from alloctune.plan.service import run
        from alloctune.progress import progress_on_stderr
        from alloctune.units import parse_user_size

        caps = parse_sizes(budget, "--budget") + parse_sizes(cap, "--cap")  # --cap: the old spelling
        if not card and not caps and size is None and not json_out and save is None and png is None:
            card = list(DEFAULT_CARDS)
        for option, path in (("--png", png), ("--save", save)):
            if path is not None and not path.parent.exists():
                raise InputError(f"{option}: directory {str(path.parent)!r} does not exist")
        runner: Any = None
        if confirm is not None:  # real runs of the program: the runner is imported only when asked for
            from alloctune.run.runner import run_trial as runner
        with progress_on_stderr(quiet=json_out, console=err_console) as progress:
            report = run(
                inputs, save=save, hold_back=hold_back, export=export, png=png, rvc=rvc, rvc_pad=rvc_pad,
                confs=list(conf or [""]), cards=parse_sizes(card, "--card"), caps=caps, size=size,
                step=step, max_size=max_size, curve=[c for c in curve.split(",") if c.strip()] if curve else None,
                torch=torch_version, context=parse_user_size(context, "--context"), progress=progress,
                confirm=command_words(confirm), confirm_runs=confirm_runs, runner=runner,
                calibrations=list(calibration or []), store=store,
            )
        render_report(report, json_out=json_out, torch=torch_version)
