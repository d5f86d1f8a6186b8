"""`alloctune plan INPUTS... [--card 6GiB] [--cap 3GiB] [--conf ...] [--size N]`: what fits where.

Parses, calls `alloctune.plan.service.run`, renders through `cli/plan_view.py`. INPUTS: a saved trace set
(`.atraceset`), or recordings `FILE:SIZE` (torch `_dump_snapshot` pickles or alloctune
traces; `FILE` alone when its sidecar names the size; a directory from `record --size`).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def _sizes(values: list[str] | None, option: str) -> list[int]:
    from alloctune.units import parse_user_size

    out = []
    for v in values or []:
        out.extend(parse_user_size(p.strip(), option) for p in v.split(",") if p.strip())
    return out


def _command(text: Optional[str]) -> Optional[List[str]]:
    """--confirm's program, split as a shell would (no shell runs it)."""
    import shlex

    from alloctune.errors import InputError

    if text is None:
        return None
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise InputError(f"--confirm {text!r}: {exc}") from None
    if not words:
        raise InputError("--confirm needs a program, e.g. --confirm 'python infer.py --len {size}'")
    return words


def _runner():  # noqa: ANN202 - run_trial's own signature
    from alloctune.run.runner import run_trial

    return run_trial


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
        """Largest input size per card/cap and setting, min budget vs size, and the card one size needs.

        Example: `alloctune plan rvc-*.pickle.xz --card 4GB,6GB,8GB --conf expandable_segments:True --rvc`
        or `alloctune plan a.pickle:1024 b.pickle:2048 c.pickle:4096 --card 3GiB --size 3000`.
        """
        from alloctune.cli.common import err_console, print_json
        from alloctune.cli.plan_view import render_plan
        from alloctune.errors import InputError
        from alloctune.plan.service import run
        from alloctune.units import parse_user_size

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
            cards=_sizes(card, "--card"),
            caps=_sizes(cap, "--cap"),
            size=size,
            step=step,
            max_size=max_size,
            curve=[c for c in curve.split(",") if c.strip()] if curve else None,
            torch=torch_version,
            context=parse_user_size(context, "--context"),
            progress=progress,
            confirm=_command(confirm),
            confirm_runs=confirm_runs,
            runner=_runner() if confirm is not None else None,
            calibrations=list(calibration or []),
            store=store,
        )
        if json_out:
            print_json(report.to_dict())
        else:
            if live:
                err_console.print(" " * 70, end="\r")
            render_plan(report)

