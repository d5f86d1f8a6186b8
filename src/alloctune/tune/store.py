"""The append-only results store of a sweep: one JSON line per finished trial.

Why JSONL with an fsync per line: a sweep of GPU trials takes minutes to hours and can die
at any point (Ctrl-C, a kill, a reboot). Every finished trial is on disk before the next one
starts, and a torn last line (the process died mid-write) is dropped on the next open, so
`--resume` loses at most the trial that was running.

Line format (schema `STORE_SCHEMA`)::

    {"schema": 1, "kind": "header", "command": [...], "created": float}          (first line)
    {"schema": 1, "kind": "trial", "key": {...}, "result": TrialResult.to_dict()}

A trial's key is (command, config string, budget, repeat index, recorded?), see `trial_key`.

One sweep per store: opening takes an exclusive lock on `<store>.lock` (`filelock`: `flock` on
POSIX, `LockFileEx` on Windows, both released by the OS when the process dies, so a kill -9
leaves no stale lock); a second `tune` on the same store gets a one-line error naming the
holder's pid (`<store>.owner`, written by the holder: a contender's attempt may truncate the
lock file, and on Windows its locked byte cannot be read) instead of running every trial again
and overwriting the first one's logs. Damaged lines (torn by a kill, not a trial, a lost header) are skipped with
a warning that names them (`TrialStore.warnings`); every complete trial is kept, including a
last one whose final newline was never written.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from alloctune.errors import InputError
from alloctune.run.trial import TrialResult, remedy_switches

STORE_SCHEMA = 1
# Only these outcomes count as finished for --resume; a crash or timeout is tried again
# (the user may have fixed the cause or raised --timeout).
REUSABLE = ("ok", "oom")


def trial_key(
    command: Sequence[str],
    conf: str,
    budget: int | None,
    repeat: int = 0,
    record: bool = False,
    *,
    no_grad: bool = False,
    cudnn_benchmark: bool | None = None,
    checkpointing: bool = False,
) -> str:
    """The identity of a trial, as a canonical JSON string (hashable, stable across runs; the remedy
    switches appear only when set, so the keys of earlier stores still match)."""
    key = {
        "command": list(command),
        "conf": conf,
        "budget": budget,
        "repeat": repeat,
        "record": record,
        **remedy_switches(no_grad, cudnn_benchmark, checkpointing),
    }
    return json.dumps(key, sort_keys=True)


@dataclass
class _HeldLock:
    """A store lock this process holds.

    Attributes:
        lock: the `filelock.FileLock` on `<store>.lock`.
        owner: the `<store>.owner` note naming this process.
        users: how many open `TrialStore` objects share it.
    """

    lock: Any
    owner: Path
    users: int = 1


# Locks this process holds, by resolved lock path. A lock is per process: the same process may
# open its own store twice (tests, resume logic).
_HELD: dict[str, _HeldLock] = {}


class StoreBusy(InputError):
    """Another process is running a sweep on this store."""


def _lock(path: Path) -> str:
    """Take the store's lock for this process (exclusive, non-blocking); returns its key."""
    from filelock import FileLock, Timeout

    lock_path = path.with_name(path.name + ".lock")
    owner_path = path.with_name(path.name + ".owner")
    key = str(lock_path.resolve())
    held = _HELD.get(key)
    if held is not None:
        held.users += 1
        return key
    # thread_local=False: a store opened in one thread may be closed in another
    lock = FileLock(str(lock_path), timeout=0, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        try:
            owner = owner_path.read_text(errors="replace").strip()[:40]
        except OSError:
            owner = ""
        raise StoreBusy(
            f"results store {path} is in use by another alloctune tune ({owner or 'pid unknown'}); "
            "wait for it to finish, or give another --store"
        ) from None
    try:
        owner_path.write_text(f"pid {os.getpid()}\n")
    except OSError:
        pass  # the note only words a contender's error
    _HELD[key] = _HeldLock(lock, owner_path)
    return key


def _unlock(key: str) -> None:
    held = _HELD.get(key)
    if held is None:
        return
    held.users -= 1
    if held.users <= 0:
        del _HELD[key]
        # The note goes while the lock is held, so it never removes the next holder's.
        try:
            held.owner.unlink(missing_ok=True)
        except OSError:
            pass
        held.lock.release(force=True)


class TrialStore:
    """Open (or create) a store file; `get` finds finished trials, `append` persists new ones.

    `rotate=True`: an existing store (of a sweep not being resumed) is renamed to
    `trials.<mtime>.jsonl` under the lock (`rotated_to` says where), instead of an error.
    """

    def __init__(self, path: str | os.PathLike, command: Sequence[str], *, resume: bool = False, rotate: bool = False):
        self.path = Path(path)
        self.command = list(command)
        self.skipped_lines = 0  # unreadable lines seen while loading (a torn last line, usually)
        self.warnings: list[str] = []  # one per skipped line, naming it
        self.rotated_to: Path | None = None
        self._trials: dict[str, TrialResult] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_key: str | None = _lock(self.path)
        try:
            exists = self.path.exists() and self.path.stat().st_size > 0
            if exists and not resume and rotate:
                self.rotated_to = self.path.with_name(f"trials.{int(self.path.stat().st_mtime)}.jsonl")
                self.path.rename(self.rotated_to)
                exists = False
            if exists and not resume:
                raise InputError(
                    f"results store {self.path} already exists: add --resume to continue that sweep, or give another --store"
                )
            if exists:
                self._load()
            else:
                self._write_line({"schema": STORE_SCHEMA, "kind": "header", "command": self.command, "created": time.time()})
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the lock (also released when the process exits, however it exits)."""
        if self._lock_key is not None:
            _unlock(self._lock_key)
            self._lock_key = None

    def __enter__(self) -> TrialStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- reading ----------------------------------------------------------------------------
    def _skip(self, lineno: int, why: str) -> None:
        self.skipped_lines += 1
        self.warnings.append(f"{self.path}: line {lineno}: {why}; skipped")

    def _load(self) -> None:
        data = self.path.read_bytes()
        good_end = data.rfind(b"\n") + 1
        tail = data[good_end:]
        if tail.strip():
            # No final newline: a finished trial whose newline was lost is kept (and the file
            # repaired); anything else there is a write torn by a kill and is cut off.
            if _complete_record(tail):
                with open(self.path, "ab") as fh:
                    fh.write(b"\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                data = data + b"\n"
                good_end = len(data)
            else:
                self._skip(data[:good_end].count(b"\n") + 1, "torn (cut off by a kill while it was written)")
                with open(self.path, "r+b") as fh:
                    fh.truncate(good_end)
                    fh.flush()
                    os.fsync(fh.fileno())
        saw_header = False
        for lineno, line in enumerate(data[:good_end].splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                self._skip(lineno, "not JSON (a torn or overwritten write)")
                continue
            if not isinstance(rec, dict):
                self._skip(lineno, f"JSON {type(rec).__name__}, not a store record")
                continue
            if rec.get("kind") == "header":
                saw_header = True
                if rec.get("command") != self.command:
                    cmd = rec.get("command")
                    shown = " ".join(map(str, cmd)) if isinstance(cmd, list) else repr(cmd)
                    raise InputError(f"results store {self.path} belongs to another command ({shown:.200}): give another --store")
                continue
            if rec.get("kind") != "trial" or rec.get("schema") != STORE_SCHEMA:
                self._skip(lineno, f"not a trial record (kind {rec.get('kind')!r:.40}, schema {rec.get('schema')!r:.20})")
                continue
            try:
                key = json.dumps(rec["key"], sort_keys=True)
                if not isinstance(rec["key"], dict) or rec["key"].get("command") != self.command:
                    self._skip(lineno, "a trial of another command")
                    continue
                self._trials[key] = TrialResult.from_dict(rec["result"])
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                self._skip(lineno, f"a damaged trial ({type(exc).__name__}: {exc!s:.60})")
        if not saw_header:
            self.warnings.append(
                f"{self.path}: no header line (lost or overwritten); kept the {len(self._trials)} trial(s) of this command"
            )

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
        if self._lock_key is None:
            raise InputError(f"results store {self.path} was closed")
        line = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())


def _complete_record(tail: bytes) -> bool:
    """Whether the bytes after the last newline are one whole store record (newline lost)."""
    try:
        rec = json.loads(tail)
    except ValueError:
        return False
    return isinstance(rec, dict) and rec.get("kind") == "trial" and isinstance(rec.get("result"), dict)
