"""The append-only results store of a sweep: one JSON line per finished trial.

Why JSONL with an fsync per line: a sweep of GPU trials takes minutes to hours and can die
at any point (Ctrl-C, a kill, a reboot). Every finished trial is on disk before the next one
starts, and a torn last line (the process died mid-write) is dropped on the next open, so
`--resume` loses at most the trial that was running.

Line format (schema `STORE_SCHEMA`)::

    {"schema": 1, "kind": "header", "command": [...], "created": float}          (first line)
    {"schema": 1, "kind": "trial", "key": {...}, "result": TrialResult.to_dict()}

A trial's key is (command, config string, budget, repeat index, recorded?), see `trial_key`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from alloctune.errors import InputError
from alloctune.trial import TrialResult

STORE_SCHEMA = 1
# Only these outcomes count as finished for --resume; a crash or timeout is tried again
# (the user may have fixed the cause or raised --timeout).
REUSABLE = ("ok", "oom")


def trial_key(command: Sequence[str], conf: str, budget: int | None, repeat: int = 0, record: bool = False) -> str:
    """The identity of a trial, as a canonical JSON string (hashable, stable across runs)."""
    return json.dumps(
        {"command": list(command), "conf": conf, "budget": budget, "repeat": repeat, "record": record},
        sort_keys=True,
    )


class TrialStore:
    """Open (or create) a store file; `get` finds finished trials, `append` persists new ones."""

    def __init__(self, path: str | os.PathLike, command: Sequence[str], *, resume: bool = False):
        self.path = Path(path)
        self.command = list(command)
        self.skipped_lines = 0  # unreadable lines seen while loading (a torn last line, usually)
        self._trials: dict[str, TrialResult] = {}
        exists = self.path.exists() and self.path.stat().st_size > 0
        if exists and not resume:
            raise InputError(
                f"results store {self.path} already exists: add --resume to continue that sweep, "
                "or give another --store"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if exists:
            self._load()
        else:
            self._write_line({"schema": STORE_SCHEMA, "kind": "header", "command": self.command, "created": time.time()})

    # ---- reading ----------------------------------------------------------------------------
    def _load(self) -> None:
        data = self.path.read_bytes()
        good_end = data.rfind(b"\n") + 1  # everything after the last newline is a torn write
        if good_end < len(data):
            self.skipped_lines += 1
            with open(self.path, "r+b") as fh:
                fh.truncate(good_end)
                fh.flush()
                os.fsync(fh.fileno())
        for line in data[:good_end].splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                self.skipped_lines += 1
                continue
            if rec.get("kind") == "header":
                if rec.get("command") != self.command:
                    raise InputError(
                        f"results store {self.path} belongs to another command ({' '.join(rec.get('command') or [])}): "
                        "give another --store"
                    )
                continue
            if rec.get("kind") != "trial" or rec.get("schema") != STORE_SCHEMA:
                self.skipped_lines += 1
                continue
            try:
                key = json.dumps(rec["key"], sort_keys=True)
                self._trials[key] = TrialResult.from_dict(rec["result"])
            except (KeyError, TypeError, ValueError):
                self.skipped_lines += 1

    def get(self, key: str) -> TrialResult | None:
        """A finished trial with this key (ok/oom only), or None."""
        found = self._trials.get(key)
        if found is None or found.outcome not in REUSABLE:
            return None
        return found

    def __len__(self) -> int:
        return len(self._trials)

    def __iter__(self) -> Iterator[TrialResult]:
        return iter(self._trials.values())

    # ---- writing ----------------------------------------------------------------------------
    def append(self, key: str, result: TrialResult) -> None:
        """Persist one finished trial now (flush + fsync) before anything else happens."""
        self._write_line({"schema": STORE_SCHEMA, "kind": "trial", "key": json.loads(key), "result": result.to_dict()})
        self._trials[key] = result

    def _write_line(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
