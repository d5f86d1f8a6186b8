"""`alloctune tune -- CMD ...`: find the allocator setting that lets a workload fit a budget."""

from __future__ import annotations

import typer

from alloctune.cli import options


def register(app: typer.Typer) -> None:
    @app.command(
        "tune",
        context_settings={"allow_interspersed_args": False},
        no_args_is_help=True,
    )
    def tune(
        command: options.TuneCommand,
        budget: options.TuneBudget = None,
        knobs: options.TuneKnobs = None,
        strategy: options.TuneStrategy = "confirm",
        platform: options.TunePlatform = None,
        max_gpu_runs: options.TuneMaxGpuRuns = 10,
        throughput: options.TuneThroughput = "auto",
        store: options.TuneStore = None,
        resume: options.TuneResume = False,
        simulate_first: options.TuneSimulateFirst = False,
        repeat: options.TuneRepeat = 1,
        timeout: options.TuneTimeout = None,
        executor: options.TuneExecutor = None,
        jobs: options.TuneJobs = None,
        address: options.TuneAddress = None,
        remedies: options.TuneRemedies = True,
        json_out: options.TuneJson = False,
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
            command,
            budget=parse_user_size(budget, "--budget") if budget is not None else None,
            knobs=knobs,
            strategy=strategy,
            platform=platform,
            store=store,
            resume=resume,
            simulate_first=simulate_first,
            repeat=repeat,
            timeout=timeout,
            max_gpu_runs=max_gpu_runs,
            throughput=throughput,
            on_trial_start=shown.started,
            on_trial_end=shown.finished,
            progress=shown.simulating,
            executor_name=executor,
            jobs=jobs,
            address=address,
            remedies=remedies,
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
