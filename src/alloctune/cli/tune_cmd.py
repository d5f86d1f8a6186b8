"""`alloctune tune -- CMD ...`: find the allocator setting that lets a workload fit a budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

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
        store: Optional[Path] = typer.Option(None, "--store", help="Results store (JSONL); default under ~/.cache/alloctune/tune/."),
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
            "as fit in its free memory at the budget, at most one per CPU core). Throughput trials always run alone."
        ),
        address: Optional[str] = typer.Option(
            None, "--address", help="--executor ray: 'auto' or HOST:PORT of a running cluster (default: a local Ray)."
        ),
        json_out: bool = typer.Option(False, "--json", help="Print every trial and the recommendation as JSON."),
    ) -> None:
        """Simulate every allocator setting from one recorded run, confirm the best on the GPU, recommend it.

        Each trial is a fresh process with the agent inside, stored at once: Ctrl-C loses nothing (--resume).
        """
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from alloctune.cli.common import err_console, print_json, warn
        from alloctune.errors import AlloctuneError
        from alloctune.tune.session import prepare
        from alloctune.units import parse_size

        progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                            console=err_console, transient=True)
        task = progress.add_task("starting", total=None)

        def started(conf: str, cap_: Optional[int], purpose: str) -> None:
            progress.update(task, description=f"trial {len(session.tuner.trials) + 1}: {purpose} ({_budget(cap_)})")

        def finished(rec: Any) -> None:
            r = rec.result
            src = " [dim](from store)[/dim]" if rec.reused else ""
            progress.console.print(
                f"  #{len(session.tuner.trials):<3} {r.conf or '(default)'} @ {_budget(r.budget)} → "
                f"{_outcome(r.outcome)}  peak reserved {_fmt(r.peak_reserved)}  {r.wall_s:.1f} s{src}"
            )

        def simulating(step: str, done: int = 0, total: Optional[int] = None) -> None:
            of = f" ({done}/{total})" if total else ""
            progress.update(task, description=f"{step}{of}")

        session = prepare(
            command, budget=parse_size(budget) if budget is not None else None, knobs=knobs, strategy=strategy,
            platform=platform, store=store, resume=resume, simulate_first=simulate_first, repeat=repeat,
            timeout=timeout, max_gpu_runs=max_gpu_runs, on_trial_start=started, on_trial_end=finished,
            progress=simulating, executor_name=executor, jobs=jobs, address=address,
        )
        if session.moved_previous is not None:
            warn(f"the previous sweep of this command was moved to {session.moved_previous} (use --resume to continue one)")
        for line in session.store_warnings:  # each damaged store line, named
            warn(line)
        path = session.store_path
        try:
            with progress:
                outcome = session.run()
        except KeyboardInterrupt:
            _render_trials(session.tuner.trials, title="trials so far (interrupted)")
            err_console.print(f"{len(session.tuner.trials)} trial(s) kept in {path}; continue with --resume --store {path}")
            raise
        except AlloctuneError:
            if session.tuner.trials and not json_out:
                _render_trials(session.tuner.trials, title="trials so far")
            raise
        if json_out:
            print_json(outcome.to_dict())
            return
        _render_result(outcome.result, outcome.recommendation, path, outcome.elapsed_s)


def _fmt(n: Optional[int]) -> str:
    from alloctune.units import format_mib

    return "-" if n is None else format_mib(n)


def _budget(n: Optional[int]) -> str:
    return "no budget" if n is None else _fmt(n)


def _outcome(outcome: str) -> str:
    colour = _COLOURS.get(outcome, "white")
    return f"[{colour}]{outcome}[/{colour}]"


def _measured(s: Any) -> str:
    if s.min_budget is None:
        return "-" if s.feasible is None else ("fits" if s.feasible else "no fit")
    return _fmt(s.min_budget)


def _rate(s: Any) -> str:
    if s.throughput is None:
        return "-"
    if s.throughput_noise is None:
        return f"{s.throughput:.3g} (n=1)" if s.throughput_samples else f"{s.throughput:.3g}"
    return f"{s.throughput:.3g} ± {s.throughput_noise:.2g}"


def _render_trials(trials: Any, title: str = "trials") -> None:
    from rich.text import Text

    from alloctune.cli.common import console
    from alloctune.cli.render import Col, FitTable

    t = FitTable(Col("#", justify="right", nowrap=True), "setting", Col("budget", nowrap=True), "outcome",
                 Col("peak\nreserved", justify="right", nowrap=True), Col("OOMs", justify="right", nowrap=True),
                 "why", title=title)
    mismatched = []
    for i, rec in enumerate(trials, 1):
        r = rec.result
        setting = r.conf or "(default)"
        if r.warnings:  # the allocator did not run with what was asked: the trial is refused
            setting += " (!)"
            mismatched.append(f"#{i}: {'; '.join(r.warnings)}")
        t.add_row(
            f"{i}{'*' if rec.reused else ''}",
            setting,
            _budget(r.budget),
            Text(r.outcome, style=_COLOURS.get(r.outcome, "")),
            _fmt(r.peak_reserved),
            "-" if r.num_ooms is None else str(r.num_ooms),
            rec.purpose,
        )
    console.print(t)
    for line in mismatched:
        console.print(Text(f"(!) {line}", style="yellow"))
    if any(rec.reused for rec in trials):
        console.print("[dim]* taken from the results store (--resume)[/dim]")


_COLOURS = {"ok": "green", "oom": "red", "crash": "red", "timeout": "yellow"}


def _render_result(result: Any, rec: Any, store: Path, elapsed: float) -> None:
    from rich.text import Text

    from alloctune.cli.common import console
    from alloctune.cli.render import Col, FitTable

    _render_trials(result.trials)
    t = FitTable("setting", Col("simulated", nowrap=True), Col("measured", nowrap=True), "verified",
                 "throughput", Col("runs", justify="right", nowrap=True),
                 title=f"candidates at the budget {_fmt(result.budget)}")
    best = result.ranking.best
    why = []
    for s in result.ranking.order:
        verdict = "recommended" if s is best else result.ranking.reasons.get(s.candidate.conf, "")
        why.append((s.candidate.label, verdict, s is best))
        t.add_row(
            Text(s.candidate.label, style="bold green") if s is best else s.candidate.label,
            _fmt(s.sim_min_budget),
            _measured(s),
            "-" if s.verified is None else ("yes" if s.verified else "no"),
            _rate(s),
            str(s.trials),
        )
    console.print(t)
    console.print("[dim]simulated / measured: smallest working budget (measured = a tested pass; "
                  "verified = a tested failure within 1 % below it)[/dim]")
    for label, text, chosen in why:
        console.print(Text.assemble(("→ " if chosen else "- ", "bold green" if chosen else ""), f"{label}: {text}"))
    for note in result.notes:
        console.print(Text(f"note: {note}"))
    console.print(f"\n[bold]{rec.summary}[/bold]")
    for shell, text in rec.lines.items():
        console.print(f"[dim]{shell}:[/dim]")
        console.print(text, markup=False, highlight=False)
    fresh = result.fresh_trials
    after = result.to_dict()["gpu_runs_after_baseline"]
    console.print(
        f"\n{len(result.trials)} trials ({fresh} run, {after} after the baseline, {len(result.trials) - fresh} from "
        f"the store) in {elapsed:.0f} s; store: {store}"
    )
