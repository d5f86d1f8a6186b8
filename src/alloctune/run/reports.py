"""Reading a trial's agent reports and saying what happened: outcome, reason, throughput, settings.

Split out of `runner.py` (issue #20: modules under ~600 lines) because this half is pure:
it takes the report dicts, exit status and text the runner collected and never starts a
process, so it is unit-tested on its own. `alloctune.run.runner` re-exports every name.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any, Mapping, Sequence

from alloctune.units import MiB

# "throughput: 12.5 items/s", "throughput=3.2e3 tok/s", "alloctune:throughput=7" (last one wins)
_THROUGHPUT_RE = re.compile(r"throughput\s*[=:]\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([^\s,;]*)", re.I)


# The evidence fields a trial and each rank carry, and the agent's `memory_stats` names behind them.
MEMORY_FIELDS = {
    "peak_reserved": "reserved_bytes.all.peak",
    "peak_allocated": "allocated_bytes.all.peak",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
}


# ---- reading the child's reports -------------------------------------------------------------
def memory_fields(stats: Mapping[str, Any]) -> dict[str, Any]:
    """The peaks, retries and OOMs of one report's `stats` (None where the agent had none)."""
    return {name: stats.get(key) for name, key in MEMORY_FIELDS.items()}


def read_reports(report_dir: Path) -> list[dict[str, Any]]:
    reports = []
    for path in sorted(report_dir.glob("report.*.json")):
        try:
            reports.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # a process killed mid-write leaves no valid report; os.replace makes that rare
    return reports


def classify(exit_code: int | None, timed_out: bool, reports: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """(outcome, reason) from the exit status and the agents' reports (pure, unit-tested).

    The exit status decides success; the reports say why a failure happened. A run that
    exits 0 is `ok` even if the program caught OOMs on the way (cuDNN does, to fall back to
    smaller workspaces): the counts stay in the evidence.
    """
    if timed_out:
        return "timeout", "killed at the timeout"
    if any(r.get("outcome") == "budget-too-large" for r in reports):
        return "budget-too-large", None
    used_cuda = any(r.get("cuda_initialized") for r in reports)
    if exit_code == 0:
        if used_cuda:
            return "ok", None
        if not reports:
            return "no-cuda", (
                "no agent report: the command ran no Python process that loaded alloctune's start-up hook "
                "(python -I/-E/-S ignore PYTHONPATH)"
            )
        return "no-cuda", _no_cuda_reason(reports)
    if any(r.get("outcome") == "oom" for r in reports):
        return "oom", None
    if reports and not used_cuda and any(r.get("torch_imported") and r.get("cuda_available") is False for r in reports):
        return "no-cuda", _no_cuda_reason(reports)
    exc = next((r.get("exception") for r in reports if r.get("exception")), None)
    if exc:
        return "crash", f"{exc.get('type')}: {exc.get('message')}"
    if any(r.get("ooms_observed") for r in reports):
        return "oom", "failed after an out-of-memory error it caught"
    if exit_code is not None and exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return "crash", f"killed by {name}"
    return "crash", f"exit code {exit_code}"


def _no_cuda_reason(reports: Sequence[Mapping[str, Any]]) -> str:
    if any(r.get("torch_imported") and r.get("cuda_available") is False for r in reports):
        return "torch in the command reports no CUDA device (torch.cuda.is_available() is False)"
    if not any(r.get("torch_imported") for r in reports):
        return "the command never imported torch"
    return "the command never initialized CUDA"


def parse_throughput(text: str) -> tuple[float | None, str | None]:
    """The last `throughput: <number> [unit]` the workload printed, if any."""
    last = None
    for last in _THROUGHPUT_RE.finditer(text):
        pass
    if last is None:
        return None, None
    return float(last.group(1)), (last.group(2) or None)


def settings_mismatch(conf: str | None, settings: Mapping[str, Any] | None) -> list[str]:
    """What the allocator really ran with versus what was asked (empty list = took effect).

    Checks the string the allocator parsed and the knobs tuning varies, as reported in the
    snapshot's `allocator_settings` (`max_split_size` in bytes, -1 = unlimited).
    """
    if conf is None or settings is None:
        return []
    problems = []
    seen = settings.get("PYTORCH_CUDA_ALLOC_CONF")
    if seen is not None and seen.strip() != conf.strip():
        problems.append(f"the allocator parsed {seen!r}, not {conf!r} (the program set its own?)")
    wanted = _knobs(conf)
    checks = {
        "max_split_size_mb": ("max_split_size", lambda v: int(v) * MiB, -1),
        "expandable_segments": ("expandable_segments", lambda v: v == "True", False),
        "garbage_collection_threshold": ("garbage_collection_threshold", float, 0.0),
    }
    for knob, (key, convert, default) in checks.items():
        if key not in settings:
            continue
        try:
            want = convert(wanted[knob]) if knob in wanted else default
        except ValueError:
            continue
        got = settings[key]
        if isinstance(want, float) and got is not None:
            same = abs(float(got) - want) < 1e-9
        else:
            same = got == want
        if not same:
            problems.append(f"{knob}: asked {wanted.get(knob, 'default')}, allocator ran with {key}={got!r}")
    return problems


def _knobs(conf: str) -> dict[str, str]:
    """`key:value` pairs of an allocator string (list values kept as text)."""
    out, depth, token = {}, 0, ""
    for ch in conf + ",":
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            key, _, value = token.partition(":")
            if key.strip():
                out[key.strip()] = value.strip()
            token = ""
        else:
            token += ch
    return out


def _tail(path: Path | None, limit: int = 4000) -> str:
    if path is None or not path.exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - limit))
        return fh.read().decode("utf-8", errors="replace")


def _last_line(text: str) -> str | None:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else None
