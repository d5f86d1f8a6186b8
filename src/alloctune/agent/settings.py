"""What the agent is told and the numbers it derives: `ALLOCTUNE_AGENT`, rank variables, the cap fraction.

Split from `bootstrap.py` so that file keeps only the agent's work in the process. Same rule as
there: standard library only, because in the child it is loaded by file path, possibly in an
interpreter where alloctune is not installed.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

ENV_VAR = "ALLOCTUNE_AGENT"
STATE_DIR_VAR = "ALLOCTUNE_STATE_DIR"
CONFIG_FILE = "agent.json"  # when ALLOCTUNE_AGENT names a directory


_DEFAULTS: dict[str, Any] = {
    "report_dir": None,  # where report.<pid>.json goes; None = no report
    "budget": None,  # bytes; per-process cap applied at CUDA init
    "ensure_cap": False,  # make the cap active even at the full card (GC needs a fraction < 1)
    "record": None,  # path for the full allocator history snapshot (pickle)
    "record_max_entries": 5_000_000,
    "on_oom": None,  # "snapshot": keep a bounded history ring and dump it when an OOM happens
    "oom_max_entries": 100_000,
    "oom_dir": None,  # where `oom-snapshot.<pid>.pickle` goes (default: the report directory)
    # Stack frames kept with each allocation of a recorded history: "python" (where the memory goes,
    # `alloctune explain`), "all" (with C++ frames: cuDNN/cuBLAS workspaces), "none" (cheapest).
    "stacks": "python",
    # Opt-in: run the program with autograd off (torch.set_grad_enabled(False) at torch import, main thread),
    # to measure what `torch.no_grad()` would save an inference program that never runs backward.
    "no_grad": False,
    # Opt-in: torch.backends.cudnn.benchmark set to this (True / False) at torch import; None leaves it
    # as the program sets it. Measures what the cuDNN switch changes in a convolution program (#29.3).
    "cudnn_benchmark": None,
    # Opt-in: activation checkpointing switched on in the first model called in training
    # (agent/checkpointing.py): the confirming run of the checkpointing remedy.
    "checkpointing": False,
    "live": True,
    "live_interval": 1.0,
    "state_dir": None,  # default $ALLOCTUNE_STATE_DIR or ~/.cache/alloctune/live
    "conf": None,  # the allocator string the runner applied (for reports and live samples)
    "device": None,  # CUDA device measured and capped; None = LOCAL_RANK's, else the current one
}


def load_config(value: str | None) -> dict[str, Any] | None:
    """Read `ALLOCTUNE_AGENT`: inline JSON (starts with `{`) or a directory.

    A directory receives the reports; its optional `agent.json` holds the other settings.
    Returns None when the variable is unset or empty (agent stays off).
    """
    if not value or not value.strip():
        return None
    value = value.strip()
    if value.startswith("{"):
        cfg = json.loads(value)
    else:
        cfg = {}
        path = os.path.join(value, CONFIG_FILE)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                cfg = json.load(fh)
        cfg.setdefault("report_dir", value)
    return with_defaults(cfg)


def with_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """`config` over `_DEFAULTS`: every key the agent reads is present."""
    merged = dict(_DEFAULTS)
    merged.update(config)
    return merged


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def default_state_dir() -> str:
    return os.environ.get(STATE_DIR_VAR) or os.path.join(os.path.expanduser("~"), ".cache", "alloctune", "live")


def fraction_for(budget: int, total: int, ensure_cap: bool = False) -> float:
    """The memory fraction whose cap (`int(fraction * total)`) is at least `budget` bytes.

    The allocator truncates `fraction * total`, and the float division can land one ulp
    low, which would make the cap one byte smaller than asked; step up by ulps until the
    truncated product reaches the budget. With `ensure_cap` a fraction of 1 becomes the
    largest float below 1: from torch 2.10 a cap (and so garbage collection) exists only
    for fractions < 1.
    """
    fraction = min(budget / total, 1.0)
    while fraction < 1.0 and int(fraction * total) < budget:
        fraction = math.nextafter(fraction, 2.0)
    if ensure_cap and fraction >= 1.0:
        fraction = math.nextafter(1.0, 0.0)
    return fraction
