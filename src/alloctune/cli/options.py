"""The options of the commands that take many, each declared once as an `Annotated` type.

A command module lists its parameters as `name: options.Alias = default` (typer reads the flag
names, metavar and help from the alias, the default from the signature), so the signature reads
as the command's list of options. Declarations that several commands share word for word are
one alias (`Json`, `RecordedDevice`); the rest are named after their command. Help texts are
rich markup, as typer renders them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer

# ---- shared by several commands ------------------------------------------------------------------
RecordedDevice = Annotated[
    Optional[int], typer.Option("--device", "-d", metavar="N", help="Device index (needed if several recorded).")
]
Json = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]

# ---- tune ----------------------------------------------------------------------------------------
TuneCommand = Annotated[List[str], typer.Argument(help="The workload to tune, after `--`.", metavar="-- CMD [ARGS]...")]
TuneBudget = Annotated[
    Optional[str], typer.Option("--budget", help="The memory the workload must fit in, e.g. 6GiB (default: the whole card).")
]
TuneKnobs = Annotated[
    Optional[List[str]],
    typer.Option(
        "--knobs",
        help="Knobs to try, comma-separated, values after '=' split by '/': "
        "expandable, max_split[=128/256], gc[=0.6/0.8], roundup[=4/8] (default: all).",
    ),
]
TuneStrategy = Annotated[
    str,
    typer.Option(
        "--strategy",
        help="confirm (simulate every candidate, confirm the best on the GPU), exhaustive (measure every "
        "candidate on the GPU; auto is the old name) or grid (exhaustive, every max_split_size_mb value).",
    ),
]
TunePlatform = Annotated[
    Optional[str],
    typer.Option(
        "--platform",
        help="linux or windows: where the setting will be used (default: this machine); windows never gets expandable_segments.",
    ),
]
TuneMaxGpuRuns = Annotated[int, typer.Option("--max-gpu-runs", help="confirm: GPU runs after the baseline, at most.")]
TuneThroughput = Annotated[
    str,
    typer.Option(
        "--throughput",
        help="confirm: auto (compare throughput with runs alone on the GPU only when the "
        "simulated allocator work of the best could slow it by the tolerance, and never when the default does not "
        "complete at the budget: it has no rate there to compare with) or measure (always sample the best alone).",
    ),
]
TuneStore = Annotated[Optional[Path], typer.Option("--store", help="Results store (JSONL); default: ~/.cache/alloctune/tune/.")]
TuneResume = Annotated[bool, typer.Option("--resume", help="Continue the sweep in the store, skipping finished trials.")]
TuneSimulateFirst = Annotated[
    bool, typer.Option("--simulate-first", help="exhaustive: rank all candidates with the simulator, run only the top three.")
]
TuneRepeat = Annotated[int, typer.Option("--repeat", help="Run every (setting, budget) point N times; all must pass.")]
TuneTimeout = Annotated[
    Optional[float],
    typer.Option("--timeout", help="Kill a trial after S s (default: 5x the baseline's wall time, at least 60 s)."),
]
TuneExecutor = Annotated[
    Optional[str],
    typer.Option(
        "--executor",
        help="Where trials run: local (this GPU, --jobs side by side), gpus (one per visible "
        "GPU), ray (Ray tasks). Default: one after another on this GPU.",
    ),
]
TuneJobs = Annotated[
    Optional[int],
    typer.Option(
        "--jobs",
        help="Trials side by side on one GPU (with --executor local, the default then: as many "
        "as fit in its free memory at the budget, at most one per CPU core; confirm without --executor: up to "
        "4 side by side when NVML reads the free memory). Throughput trials always run alone.",
    ),
]
TuneAddress = Annotated[
    Optional[str],
    typer.Option("--address", help="--executor ray: 'auto' or HOST:PORT of a running cluster (default: a local Ray)."),
]
TuneRemedies = Annotated[
    bool,
    typer.Option(
        "--remedies/--no-remedies",
        help="confirm: program-level remedies beside the settings (release "
        "points, the Janitor, workspace caps: simulated; torch.no_grad() for inference run with autograd on: "
        "one confirming run).",
    ),
]
TuneJson = Annotated[bool, typer.Option("--json", help="Print every trial and the recommendation as JSON.")]

# ---- plan ----------------------------------------------------------------------------------------
PlanInputs = Annotated[
    List[str],
    typer.Argument(
        metavar="INPUTS...",
        help="TRACESET.atraceset, or FILE:SIZE ... (two or more sizes), or a directory written by record --size",
    ),
]
PlanCard = Annotated[Optional[List[str]], typer.Option("--card", help="card memory, e.g. 6GiB (repeatable, or 4GiB,8GiB)")]
PlanBudget = Annotated[
    Optional[List[str]],
    typer.Option(
        "--budget",
        "-b",
        help="per-process budget on the "
        "recording's device (set_per_process_memory_fraction), e.g. "
        "3GiB; repeatable, or 2GiB,3GiB",
    ),
]
PlanCap = Annotated[Optional[List[str]], typer.Option("--cap", hidden=True, help="the old name of --budget")]
PlanConf = Annotated[Optional[List[str]], typer.Option("--conf", "-c", help="allocator setting (repeatable); default: unset")]
PlanSize = Annotated[
    Optional[str],
    typer.Option(
        "--size", help="answer for this input size: peak reserved, completes per card/budget, min budget, smallest card"
    ),
]
PlanStep = Annotated[Optional[str], typer.Option("--step", help="size grid of the search (default 1 for whole sizes)")]
PlanMaxSize = Annotated[
    Optional[str],
    typer.Option(
        "--max-size",
        help="top of the search (default: open-ended, doubling until the size fails, at most 16x the largest recorded size)",
    ),
]
PlanCurve = Annotated[Optional[str], typer.Option("--curve", help="sizes for the min-budget table, e.g. 8,16,32")]
PlanSave = Annotated[Optional[Path], typer.Option("--save", help="write the size-parametric trace set here (.atraceset)")]
PlanHoldBack = Annotated[
    Optional[str],
    typer.Option("--hold-back", help="check the fit on the recording at this size: fit on the others, compare peak reserved"),
]
PlanExport = Annotated[
    Optional[str],
    typer.Option(
        "--export", help="write the stream generated at SIZE as an alloctune trace: SIZE:FILE (then alloctune simulate FILE)"
    ),
]
PlanPng = Annotated[Optional[Path], typer.Option("--png", help="min budget vs size figure (needs matplotlib)")]
PlanRvc = Annotated[
    bool, typer.Option("--rvc", help="set the answers against RVC's chunk presets (sizes = audio seconds of one unsplit file)")
]
PlanRvcPad = Annotated[float, typer.Option("--rvc-pad", help="x_pad (s) the RVC recordings were made with")]
PlanContext = Annotated[str, typer.Option("--context", help="CUDA context on a card, not available to the allocator")]
PlanTorch = Annotated[Optional[str], typer.Option("--torch", help="PyTorch release whose rules to apply")]
PlanConfirm = Annotated[
    Optional[str],
    typer.Option(
        "--confirm",
        help="run this program (quoted, {size} where the "
        "input size goes) at each predicted largest size under the target's "
        "budget; on a failure step down by the bound and run once more",
    ),
]
PlanConfirmRuns = Annotated[int, typer.Option("--confirm-runs", help="runs per answer for --confirm, at most")]
PlanCalibration = Annotated[
    Optional[List[str]],
    typer.Option(
        "--calibration",
        help="a capped run of the program "
        "whose workspaces fell back, FILE[:SIZE] (repeatable): "
        "which requests it gives up, so each answer is one number",
    ),
]
PlanStore = Annotated[
    Optional[Path],
    typer.Option(
        "--store", help="a tune store of the same program: its capped recorded runs teach the fallbacks, as --calibration does"
    ),
]
PlanJson = Annotated[bool, typer.Option("--json", help="print machine-readable JSON")]

# ---- explain -------------------------------------------------------------------------------------
ExplainRecordings = Annotated[
    List[Path],
    typer.Argument(
        metavar="RECORDING...",
        help="Snapshot (.pickle[.gz|.xz]), compact trace or a shipped trace's name (alloctune demo --list); "
        "several: the ranks of one job (NAME.rankN.pickle).",
    ),
]
ExplainAgainst = Annotated[
    Optional[Path],
    typer.Option("--against", metavar="RECORDING", help="Split the gap in peak reserved to this recording by site and category."),
]
ExplainAt = Annotated[
    Optional[str],
    typer.Option("--at", metavar="EVENT|SECONDSs", help="Event index, or a time like 12.5s (default: OOM, else peak reserved)."),
]
ExplainGroup = Annotated[
    str,
    typer.Option(
        "--group",
        metavar="line|function|file|module|model|layer",
        help="How sites are grouped (model: the model's own code; layer: also layer k of N).",
    ),
]
ExplainTop = Annotated[int, typer.Option("--top", metavar="N", help="Sites listed (the rest are summed in one row).")]
ExplainWhatIf = Annotated[bool, typer.Option("--what-if/--no-what-if", help="Simulate the min budget with each kept site freed.")]
ExplainWhatIfDir = Annotated[
    Optional[Path],
    typer.Option("--what-if-dir", metavar="DIR", help="Write each what-if's rewritten recording here (for alloctune simulate)."),
]
ExplainCalibration = Annotated[
    Optional[List[Path]],
    typer.Option(
        "--calibration",
        metavar="FILE",
        help="A recording of the same program and input run under a cap (alloctune run --budget ... --record): "
        "the fallbacks it shows (cuDNN giving workspaces up) make the min budgets those of a capped run.",
    ),
]
ExplainHtml = Annotated[
    Optional[Path],
    typer.Option("--html", metavar="FILE", help="Also write one self-contained HTML page (over time, map, what-ifs)."),
]

# ---- simulate ------------------------------------------------------------------------------------
SimulateTrace = Annotated[
    Path,
    typer.Argument(
        metavar="TRACE", help="Snapshot (.pickle[.gz|.xz]), compact trace, or a shipped trace's name (alloctune demo --list)."
    ),
]
SimulateConf = Annotated[
    Optional[List[str]],
    typer.Option("--conf", "-c", metavar="SETTING", help="Allocator setting to simulate (repeatable); default: unset."),
]
SimulateBudget = Annotated[
    Optional[str],
    typer.Option(
        "--budget",
        "-b",
        metavar="SIZE",
        help="Per-process memory cap with a unit, e.g. 6GiB = 6x2^30 bytes (6GB = 6x10^9), as torch's "
        "per-process memory fraction sets it.",
    ),
]
SimulateCard = Annotated[
    Optional[str], typer.Option("--card", metavar="SIZE", help="Card memory (default: the trace's device, else an H200's).")
]
SimulateTotalMemory = Annotated[Optional[str], typer.Option("--total-memory", hidden=True, help="The old name of --card.")]
SimulateTorch = Annotated[str, typer.Option("--torch", metavar="VERSION", help="PyTorch release whose rules to apply.")]
SimulateMinBudget = Annotated[
    bool,
    typer.Option(
        "--min-budget",
        help="Also find each setting's smallest budget that completes (bisection to 0.2 % or 1 MiB, as every command).",
    ),
]
SimulateCompare = Annotated[
    Optional[Path],
    typer.Option("--compare", metavar="RECORDING", help="Recorded trace to check the replay against (event for event)."),
]
SimulateAddresses = Annotated[
    str,
    typer.Option(
        "--addresses",
        metavar="trace|compared|model",
        help="Where new segments go: trace (where TRACE's recording put them: a prediction), "
        "compared (where --compare's recording put them: a replay), model (the driver model only).",
    ),
]
SimulateSnapshotOut = Annotated[
    Optional[Path],
    typer.Option(
        "--snapshot-out",
        metavar="FILE",
        help="Also write the simulated run (one --conf) as a torch memory snapshot that PyTorch's "
        "memory_viz opens (.pickle, .gz, .xz).",
    ),
]
