"""The MCP tools as plain functions: each parses its arguments, calls the one core function its
command calls, and returns the text `alloctune <command> --json` prints for the same arguments.

Why plain functions without the SDK: they can be read, typed and tested without it, and the
server (`alloctune.mcp.server`) registers them as they are, so the parameter names, types and
docstrings here are what an assistant sees. Errors are `AlloctuneError`s, raised as the core
raises them; the server turns each into one line.
"""

from __future__ import annotations

import json
from typing import Any

from alloctune.errors import InputError

# The tools that start the user's program on the GPU: they refuse unless called with `confirm: true`.
GPU_TOOLS = ("tune", "run")


def as_text(data: dict[str, Any]) -> str:
    """The JSON text of an answer, laid out as the CLI's `--json` prints it."""
    return json.dumps(data, indent=2)


def _given(**options: Any) -> dict[str, Any]:
    """The options a caller set: the rest keep the core function's own defaults."""
    return {k: v for k, v in options.items() if v is not None}


def _require_confirm(tool: str, confirm: bool) -> None:
    if not confirm:
        raise InputError(f"{tool} runs the command on the GPU: call it again with confirm: true to start it")


def diagnose(
    text: str | None = None,
    file: str | None = None,
    platform: str | None = None,
    budget: str | None = None,
    device: int | None = None,
    oom: int | None = None,
    what_if: bool = True,
) -> str:
    """Explain a CUDA out-of-memory error from its message, a log or a memory snapshot.

    Verdict (fragmentation, cap, contention, shortage), evidence and fixes for bash, PowerShell,
    cmd and Python. Give `text` (the OOM message, or a whole log), or
    `file` (a log, or a memory snapshot / recording / compact trace, recognised by its content).
    `platform`: linux | windows | wsl | macos, for logs. For a snapshot: `budget` (the cap the run had,
    e.g. 6GiB), `device`, `oom` (which recorded OOM, -1 = last), `what_if` (replay other settings).
    Same JSON as `alloctune diagnose FILE --json`."""
    import io

    from alloctune.diagnose.service import diagnose_input, diagnosis_json

    if (text is None) == (file is None):
        raise InputError("give either text (the OOM message or log) or file (a log, snapshot or trace path)")
    stdin = io.BytesIO(text.encode("utf-8")) if text is not None else None
    kind, result = diagnose_input(file, stdin=stdin, platform=platform, budget=budget, device=device, oom=oom, what_if=what_if)
    return as_text(diagnosis_json(kind, result))


def explain(
    recording: str,
    at: int | str | None = None,
    group: str | None = None,
    top: int | None = None,
    what_if: bool = True,
    device: int | None = None,
) -> str:
    """Where the memory goes in a recording, and what freeing each holder would save.

    A recording is a torch memory snapshot .pickle[.gz|.xz] or a compact trace. At the OOM, else at
    peak reserved, or at `at` (an event index, or a time like "12.5s"): categories that sum exactly
    to reserved memory, the sites (user line + library frame) holding it, growth per repetition,
    and with `what_if` the simulated min budget with each site freed. `group`: line (default) |
    function | file | module | model | layer; `top`: sites listed (default 20).
    Same JSON as `alloctune explain RECORDING --json`."""
    from alloctune import api

    return as_text(api.explain(recording, at=at, what_if=what_if, device=device, **_given(group=group, top=top)).to_dict())


def simulate(
    recording: str,
    settings: list[str] | None = None,
    budget: str | None = None,
    min_budget: bool = False,
    total_memory: str | None = None,
    device: int | None = None,
    torch: str | None = None,
) -> str:
    """Replay a recorded allocator history on the CPU under other settings and budgets.

    Allocator settings (e.g.
    "expandable_segments:True", "max_split_size_mb:128"; "" is the default): peak reserved and
    allocated, utilization, retries and the OOM point per setting; `budget` (e.g. 6GiB) caps the
    process; `min_budget` also finds each setting's smallest budget that completes.
    Same JSON as `alloctune simulate RECORDING --conf ... --json`."""
    from alloctune import api

    result = api.simulate(
        recording,
        list(settings or [""]),
        find_min=min_budget,
        **_given(budget=budget, total_memory=total_memory, device=device, torch=torch),
    )
    return as_text(result.to_dict())


def plan(
    recordings: list[str],
    cards: list[str] | None = None,
    caps: list[str] | None = None,
    settings: list[str] | None = None,
    size: str | None = None,
    torch: str | None = None,
) -> str:
    """Which card or cap fits which input size, from recordings at a few input sizes.

    Recordings of one program at two or more input sizes ("FILE:SIZE", or
    FILE when a sidecar names its size, or a saved .atraceset): the largest input size per card
    (`cards`, e.g. ["6GiB", "8GiB"]) or per-process cap (`caps`) under each setting, and with `size`
    the peak, min budget and smallest card for that input size.
    Same JSON as `alloctune plan INPUTS... --card ... --json`."""
    from alloctune.plan.service import run
    from alloctune.units import parse_user_size

    report = run(
        recordings,
        confs=list(settings or [""]),
        cards=[parse_user_size(c, "cards") for c in cards or []],
        caps=[parse_user_size(c, "caps") for c in caps or []],
        **_given(size=size, torch=torch),
    )
    return as_text(report.to_dict())


def config_check(
    setting: str,
    torch: str | None = None,
    platform: str | None = None,
    fraction: float | None = None,
    card: str | None = None,
    largest_segment: str | None = None,
) -> str:
    """Validate an allocator setting string for a torch release and platform.

    Checks a PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF string as a torch release would
    (`torch`, e.g. "2.11"; `platform`: linux, the default, or windows): effective values, knobs that will do
    nothing, and the lines that set it. Same JSON as `alloctune config check SETTING --json`."""
    from alloctune import api

    result = api.check_setting(
        setting, **_given(torch=torch, platform=platform, fraction=fraction, card=card, largest_segment=largest_segment)
    )
    return as_text(result.to_dict())


def tune(
    command: list[str],
    budget: str | None = None,
    knobs: list[str] | None = None,
    strategy: str | None = None,
    platform: str | None = None,
    confirm: bool = False,
) -> str:
    """Find the allocator setting that lets a program fit a memory budget (GPU; needs confirm).

    `command` is argv, e.g. ["python", "infer.py"]; `budget` e.g. 6GiB; `knobs` and `strategy`
    (confirm, exhaustive, grid) as `alloctune tune` takes them. It records one run,
    simulates every candidate and confirms the best on the GPU. Runs the command on this
    machine's GPU, so it refuses unless `confirm` is true.
    Same JSON as `alloctune tune --json -- COMMAND`."""
    _require_confirm("tune", confirm)
    from alloctune import api
    from alloctune.units import parse_user_size

    cap = parse_user_size(budget, "budget") if budget is not None else None
    return as_text(api.tune(command, **_given(budget=cap, knobs=knobs, strategy=strategy, platform=platform)).to_dict())


def run(
    command: list[str], setting: str | None = None, budget: str | None = None, timeout: float | None = None, confirm: bool = False
) -> str:
    """Run a program once under an allocator setting and a budget, and measure it (GPU; needs confirm).

    Runs `command` (argv) with the agent inside, under an allocator `setting` and a per-process
    `budget` (e.g. 6GiB): outcome, peak reserved / allocated, retries, OOMs, wall time. Runs the
    command on this machine's GPU, so it refuses unless `confirm` is true. The command's output goes
    to the server's stderr. Same JSON as `alloctune run --json -- COMMAND`."""
    _require_confirm("run", confirm)
    from alloctune.run.runner import run_trial
    from alloctune.run.trial import raise_for_environment, trial_json
    from alloctune.units import parse_seconds, parse_user_size

    cap = parse_user_size(budget, "budget") if budget is not None else None
    result = run_trial(command, conf=setting, budget=cap, timeout=parse_seconds(timeout, "timeout"), stdout_to_stderr=True)
    raise_for_environment(result)
    return as_text(trial_json(result))


TOOLS = (diagnose, explain, simulate, plan, config_check, tune, run)
