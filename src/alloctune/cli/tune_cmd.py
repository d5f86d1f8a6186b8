"""`alloctune tune -- CMD ...`: find the allocator setting that lets a workload fit a budget."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command(
        "tune",
        context_settings={"allow_interspersed_args": False},
        no_args_is_help=True,
    )
    def tune(
        command: List[str] = typer.Argument(..., help="The workload to tune, after `--`.", metavar="-- CMD [ARGS]..."),
        budget: Optional[str] = typer.Option(
            None, "--budget", help="The memory the workload must fit in, e.g. 6GiB (default: the whole card)."
        ),
        knobs: Optional[List[str]] = typer.Option(
            None,
            "--knobs",
            help="Knobs to try, comma-separated, values after '=' split by '/': "
            "expandable, max_split[=128/256], gc[=0.6/0.8], roundup[=4/8] (default: all).",
        ),
        strategy: str = typer.Option(
            "confirm", "--strategy",
            help="confirm (simulate every candidate, confirm the best on the GPU), exhaustive (measure every "
            "candidate on the GPU; auto is the old name) or grid (exhaustive, every max_split_size_mb value).",
        ),
        platform: Optional[str] = typer.Option(
            None, "--platform", help="linux or windows: where the setting will be used (default: this machine); "
            "windows never gets expandable_segments."
        ),
        max_gpu_runs: int = typer.Option(10, "--max-gpu-runs", help="confirm: GPU runs after the baseline, at most."),
        throughput: str = typer.Option(
            "auto", "--throughput", help="confirm: auto (compare throughput with runs alone on the GPU only when the "
            "simulated allocator work of the best could slow it by the tolerance, and never when the default does not "
            "complete at the budget: it has no rate there to compare with) or measure (always sample the best alone)."
        ),
        store: Optional[Path] = typer.Option(None, "--store", help="Results store (JSONL); default: ~/.cache/alloctune/tune/."),
        resume: bool = typer.Option(False, "--resume", help="Continue the sweep in the store, skipping finished trials."),
        simulate_first: bool = typer.Option(
            False, "--simulate-first", help="exhaustive: rank all candidates with the simulator, run only the top three."
        ),
        repeat: int = typer.Option(1, "--repeat", help="Run every (setting, budget) point N times; all must pass."),
        timeout: Optional[float] = typer.Option(
            None, "--timeout", help="Kill a trial after S s (default: 5x the baseline's wall time, at least 60 s)."
        ),
        executor: Optional[str] = typer.Option(
            None, "--executor", help="Where trials run: local (this GPU, --jobs side by side), gpus (one per visible "
            "GPU), ray (Ray tasks). Default: one after another on this GPU."
        ),
        jobs: Optional[int] = typer.Option(
            None, "--jobs", help="Trials side by side on one GPU (with --executor local, the default then: as many "
            "as fit in its free memory at the budget, at most one per CPU core; confirm without --executor: up to "
            "4 side by side when NVML reads the free memory). Throughput trials always run alone."
        ),
        address: Optional[str] = typer.Option(
            None, "--address", help="--executor ray: 'auto' or HOST:PORT of a running cluster (default: a local Ray)."
        ),
        remedies: bool = typer.Option(
            True, "--remedies/--no-remedies", help="confirm: program-level remedies beside the settings (release "
            "points, the Janitor, workspace caps: simulated; torch.no_grad() for inference run with autograd on: "
            "one confirming run)."
        ),
        json_out: bool = typer.Option(False, "--json", help="Print every trial and the recommendation as JSON."),
    ) -> None:
        """Simulate every allocator setting from one recorded run, confirm the best on the GPU, recommend it.

        Each trial is a fresh process with the agent inside, stored at once: Ctrl-C loses nothing (--resume).
        """
        from alloctune.cli.common import err_console, print_json, warn
        from alloctune.cli.tune_view import render_result, render_trials
        from alloctune.errors import AlloctuneError
        from alloctune.progress import TrialLines
        from alloctune.tune.session import prepare
        from alloctune.units import parse_user_size

        shown = TrialLines(err_console)
        session = prepare(
            command, budget=parse_user_size(budget, "--budget") if budget is not None else None, knobs=knobs, strategy=strategy,
            platform=platform, store=store, resume=resume, simulate_first=simulate_first, repeat=repeat,
            timeout=timeout, max_gpu_runs=max_gpu_runs, throughput=throughput, on_trial_start=shown.started,
            on_trial_end=shown.finished,
            progress=shown.simulating, executor_name=executor, jobs=jobs, address=address, remedies=remedies,
        )
        shown.count = lambda: len(session.tuner.trials)
        if session.moved_previous is not None:
            warn(f"the previous sweep of this command was moved to {session.moved_previous} (use --resume to continue one)")
        for line in session.store_warnings:  # each damaged store line, named
            warn(line)
        path = session.store_path
        try:
            with shown.bar:
                outcome = session.run()
        except KeyboardInterrupt:
            render_trials(session.tuner.trials, title="trials so far (interrupted)")
            err_console.print(f"{len(session.tuner.trials)} trial(s) kept in {path}; continue with --resume --store {path}")
            raise
        except AlloctuneError:
            if session.tuner.trials and not json_out:
                render_trials(session.tuner.trials, title="trials so far")
            raise
        if json_out:
            print_json(outcome.to_dict())
            return
        render_result(outcome.result, outcome.recommendation, path, outcome.elapsed_s)

