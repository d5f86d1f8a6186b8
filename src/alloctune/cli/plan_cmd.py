"""`alloctune plan INPUTS... [--card 6GiB] [--budget 3GiB] [--conf ...] [--size N]`: what fits where.

Parses, calls `alloctune.plan.service.run`, renders through `cli/plan_view.py`. INPUTS: a saved trace set
(`.atraceset`), or recordings `FILE:SIZE` (torch `_dump_snapshot` pickles or alloctune
traces; `FILE` alone when its sidecar names the size; a directory from `record --size`).
"""

from __future__ import annotations

from typing import Any

import typer

from alloctune.cli import options

# The cards answered for when nothing else is asked (no --card, --budget, --size, --save, --png or --json)
DEFAULT_CARDS = ("4GiB", "8GiB", "16GiB", "24GiB")


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        inputs: options.PlanInputs,
        card: options.PlanCard = None,
        budget: options.PlanBudget = None,
        cap: options.PlanCap = None,
        conf: options.PlanConf = None,
        size: options.PlanSize = None,
        step: options.PlanStep = None,
        max_size: options.PlanMaxSize = None,
        curve: options.PlanCurve = None,
        save: options.PlanSave = None,
        hold_back: options.PlanHoldBack = None,
        export: options.PlanExport = None,
        png: options.PlanPng = None,
        rvc: options.PlanRvc = False,
        rvc_pad: options.PlanRvcPad = 3.0,
        context: options.PlanContext = "518MiB",
        torch_version: options.PlanTorch = None,
        confirm: options.PlanConfirm = None,
        confirm_runs: options.PlanConfirmRuns = 2,
        calibration: options.PlanCalibration = None,
        store: options.PlanStore = None,
        json_out: options.PlanJson = False,
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
                inputs,
                save=save,
                hold_back=hold_back,
                export=export,
                png=png,
                rvc=rvc,
                rvc_pad=rvc_pad,
                confs=list(conf or [""]),
                cards=parse_sizes(card, "--card"),
                caps=caps,
                size=size,
                step=step,
                max_size=max_size,
                curve=[c for c in curve.split(",") if c.strip()] if curve else None,
                torch=torch_version,
                context=parse_user_size(context, "--context"),
                progress=progress,
                confirm=command_words(confirm),
                confirm_runs=confirm_runs,
                runner=runner,
                calibrations=list(calibration or []),
                store=store,
            )
        render_report(report, json_out=json_out, torch=torch_version)
