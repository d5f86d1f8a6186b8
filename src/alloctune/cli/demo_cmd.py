"""`alloctune demo`: the product in one command, with or without a GPU."""

from __future__ import annotations

import os
import subprocess
from typing import Optional

import typer

from alloctune.cli.common import console, print_json
from alloctune.errors import EnvironmentProblem


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        trace: Optional[str] = typer.Option(
            None, "--trace", help="Trace file, or the name of a shipped trace (see --list); default: the shipped RVC trace."
        ),
        budget: Optional[str] = typer.Option(
            None, "--budget", help="Also say whether each setting fits this per-process budget, e.g. 1.6GiB."
        ),
        gpu: Optional[bool] = typer.Option(
            None,
            "--gpu/--no-gpu",
            help="Tune the RVC workload on the GPU (default: when one is present); --gpu without one exits 2.",
        ),
        json_out: bool = typer.Option(False, "--json", help="Print machine-readable output."),
        list_traces: bool = typer.Option(False, "--list", help="List the shipped traces and exit."),
    ) -> None:
        """Show alloctune at work: tune RVC on a GPU, or simulate a real RVC trace without one."""
        from alloctune.cli import demo_view
        from alloctune.demo import core
        from alloctune.units import parse_user_size

        if list_traces:
            if json_out:
                print_json(core.shipped_trace_list())
            else:
                demo_view.render_trace_list(core.shipped_trace_info())
            return

        cap = parse_user_size(budget, "--budget") if budget else None
        # --gpu is a wish, not a fact: "GPU found" only once a child's torch has seen CUDA; an explicit
        # --gpu that cannot be honoured is an error (exit 2), never a silent simulation that exits 0
        use_gpu = core.cuda_available() if (gpu or (gpu is None and trace is None)) else False
        if gpu and not use_gpu:
            raise EnvironmentProblem(
                "--gpu: no CUDA GPU is visible to torch here, so the GPU part cannot run; "
                "drop --gpu for the simulated demo (it needs no GPU)"
            )
        if use_gpu:
            cmd = core.gpu_demo_command(json_out, cap)
            if not json_out:
                console.print(
                    f"GPU found: tuning the RVC workload under {core.demo_budget_arg(cap)}" + ("" if cap else " (a 6 GiB card)")
                )
                console.print(f"$ {' '.join(cmd[2:])}", soft_wrap=True, markup=False)
            raise typer.Exit(subprocess.call(cmd, env=os.environ.copy()))

        result = core.run_demo(trace, budget=cap)
        if json_out:
            print_json(result.to_dict())
        else:
            demo_view.render_demo(result)
