"""`alloctune tune -- CMD ...`: find the allocator setting that lets a workload fit a budget."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, List, Optional

import typer


def default_store(command: List[str], budget: Optional[int]) -> Path:
    """~/.cache/alloctune/tune/<hash of command and budget>/trials.jsonl (so --resume finds it)."""
    key = hashlib.sha256(json.dumps([command, budget]).encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "alloctune" / "tune" / key / "trials.jsonl"


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
        json_out: bool = typer.Option(False, "--json", help="Print every trial and the recommendation as JSON."),
    ) -> None:
        """Try allocator settings under a budget, measure each one's min_budget, recommend the best.

        Every trial runs the command in a fresh process with the agent inside; every finished
        trial is written to the store at once, so Ctrl-C or a crash loses nothing (--resume).
        """
        from alloctune.cli.common import print_json, warn
        from alloctune.errors import AlloctuneError, InputError
        from alloctune.runner import TrialEvaluator, resolve_command
        from alloctune.tune.candidates import parse_knobs
        from alloctune.tune.platform import check_platform
        from alloctune.tune.recommend import recommend
        from alloctune.tune.store import TrialStore
        from alloctune.tune.strategy import SimulatorFromTrace, Tuner, TuneSettings
        from alloctune.units import parse_size

        resolve_command(command)  # a missing command is an error before anything is created
        cap = parse_size(budget) if budget is not None else None
        if cap is not None and cap <= 0:
            raise InputError("--budget must be more than 0 bytes")
        if timeout is not None and timeout <= 0:
            raise InputError("--timeout must be a positive number of seconds")
        if max_gpu_runs < 2:
            raise InputError("--max-gpu-runs must be at least 2 (a pass and a failure prove a min_budget)")
        settings = TuneSettings(
            command=tuple(command),
            budget=cap,
            knobs=parse_knobs(knobs),
            strategy=strategy,
            simulate_first=simulate_first,
            repeat=repeat,
            platform=check_platform(platform),
            max_gpu_runs=max_gpu_runs,
        )
        path = store or default_store(list(command), cap)
        if store is None and not resume and path.exists() and path.stat().st_size > 0:
            old = path.with_name(f"trials.{int(path.stat().st_mtime)}.jsonl")
            path.rename(old)
            warn(f"the previous sweep of this command was moved to {old} (use --resume to continue one)")
        trial_store = TrialStore(path, command, resume=resume)
        if resume and trial_store.skipped_lines:
            warn(f"{trial_store.skipped_lines} unreadable line(s) in {path} skipped (a trial cut off by a kill)")
        workdir = path.with_suffix(".d")
        evaluator = TrialEvaluator(command, workdir, timeout=timeout)

        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from alloctune.cli.common import err_console

        progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                            console=err_console, transient=True)
        task = progress.add_task("starting", total=None)

        def started(conf: str, cap_: Optional[int], purpose: str) -> None:
            progress.update(task, description=f"trial {len(tuner.trials) + 1}: {purpose} ({_budget(cap_)})")

        def finished(rec: Any) -> None:
            r = rec.result
            src = " [dim](from store)[/dim]" if rec.reused else ""
            progress.console.print(
                f"  #{len(tuner.trials):<3} {r.conf or '(default)'} @ {_budget(r.budget)} → "
                f"{_outcome(r.outcome)}  peak reserved {_fmt(r.peak_reserved)}  {r.wall_s:.1f} s{src}"
            )

        tuner = Tuner(
            evaluator,
            settings,
            store=trial_store,
            simulator_factory=SimulatorFromTrace,
            on_trial_start=started,
            on_trial_end=finished,
        )
        t0 = time.monotonic()
        try:
            with progress:
                result = tuner.run()
        except KeyboardInterrupt:
            _render_trials(tuner.trials, title="trials so far (interrupted)")
            err_console.print(f"{len(tuner.trials)} trial(s) kept in {path}; continue with --resume --store {path}")
            raise
        except AlloctuneError:
            if tuner.trials and not json_out:
                _render_trials(tuner.trials, title="trials so far")
            raise
        rec = recommend(result)
        if json_out:
            data = result.to_dict()
            data["recommendation"] = rec.to_dict()
            data["store"] = str(path)
            data["elapsed_s"] = round(time.monotonic() - t0, 1)
            print_json(data)
            return
        _render_result(result, rec, path, time.monotonic() - t0)


def _fmt(n: Optional[int]) -> str:
    from alloctune.units import format_mib

    return "-" if n is None else format_mib(n)


def _budget(n: Optional[int]) -> str:
    return "no budget" if n is None else _fmt(n)


def _outcome(outcome: str) -> str:
    colour = {"ok": "green", "oom": "red", "crash": "red", "timeout": "yellow"}.get(outcome, "white")
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
    from rich.table import Table

    from alloctune.cli.common import console

    t = Table(title=title, title_justify="left")
    for col in ("#", "setting (as applied)", "allocator ran with", "budget", "outcome", "peak reserved",
                "peak allocated", "util", "retries", "OOMs", "wall", "throughput"):
        t.add_column(col, justify="right" if col in ("#", "retries", "OOMs", "wall", "util") else "left",
                     overflow="fold")
    for i, rec in enumerate(trials, 1):
        r = rec.result
        seen = (r.allocator_settings or {}).get("PYTORCH_CUDA_ALLOC_CONF")
        ran = "-" if r.allocator_settings is None else ("same" if (seen or "") == (r.conf or "") else repr(seen))
        if r.warnings:
            ran = f"[yellow]{ran} (!)[/yellow]"
        t.add_row(
            f"{i}{'*' if rec.reused else ''}",
            r.conf or "(default)",
            ran,
            _budget(r.budget),
            _outcome(r.outcome),
            _fmt(r.peak_reserved),
            _fmt(r.peak_allocated),
            f"{r.utilization:.0%}" if r.utilization is not None else "-",
            "-" if r.num_alloc_retries is None else str(r.num_alloc_retries),
            "-" if r.num_ooms is None else str(r.num_ooms),
            f"{r.wall_s:.1f}s",
            f"{r.throughput:g} {r.throughput_unit or ''}".rstrip() if r.throughput is not None else "-",
        )
    console.print(t)
    if any(rec.reused for rec in trials):
        console.print("[dim]* taken from the results store (--resume)[/dim]")


def _render_result(result: Any, rec: Any, store: Path, elapsed: float) -> None:
    from rich.table import Table

    from alloctune.cli.common import console

    _render_trials(result.trials)
    t = Table(title=f"candidates at the budget {_fmt(result.budget)}", title_justify="left")
    for col in ("setting", "simulated", "measured", "verified", "throughput", "runs"):
        t.add_column(col, overflow="fold")
    best = result.ranking.best
    why = []
    for s in result.ranking.order:
        verdict = "recommended" if s is best else result.ranking.reasons.get(s.candidate.conf, "")
        why.append((s.candidate.label, verdict, s is best))
        t.add_row(
            f"[bold green]{s.candidate.label}[/bold green]" if s is best else s.candidate.label,
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
        mark = "[bold green]→[/bold green]" if chosen else "-"
        console.print(f"{mark} {label}: {text}", highlight=False)
    for note in result.notes:
        console.print(f"note: {note}")
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
