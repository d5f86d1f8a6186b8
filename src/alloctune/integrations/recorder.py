"""Record the allocator history during training and, at an OOM, leave a snapshot and one line.

`OOMRecorder` is what every trainer hook holds: `start()` when training begins, `stop()` when
it ends, `report_oom(exc)` when an out-of-memory error is on its way out. The report

1. takes the allocator's snapshot *before* anything is released (the OOM's traceback still
   holds the failed step's tensors, so the memory map is the one that failed), adds the run
   record (`RUN_RECORD_KEY`) and writes it to `out_dir`;
2. diagnoses the written file with `alloctune.api.diagnose_snapshot`, which reads the cap back
   from that record (the budget is the recorded cap, not the whole card);
3. words the outcome (`OOMNote`) as ONE line on `stream`: the verdict first, then the snapshot's
   path and the next commands (`alloctune explain FILE`, `alloctune tune --budget ... -- CMD`).

Nothing in the report may hide the OOM: any failure while writing or diagnosing becomes the
line's reason (verdict "undiagnosed") and the caller re-raises the original error.
`oom_guard` is that caller for code that has no exception hook of its own.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from alloctune.agent.settings import ENV_VAR as AGENT_ENV_VAR
from alloctune.errors import InputError
from alloctune.guard.oom import is_oom
from alloctune.integrations.backend import STACKS, CudaBackend, TorchCuda, run_record
from alloctune.trace.stream import RUN_RECORD_KEY

__all__ = ["OOMNote", "OOMRecorder", "oom_guard"]

DEFAULT_MAX_ENTRIES = 100_000  # the agent's default for OOM snapshots: the lead-up, not the whole run
UNDIAGNOSED = "undiagnosed"


@dataclass(frozen=True)
class OOMNote:
    """What the hooks say about one OOM; `line()` is its only wording.

    Attributes:
        verdict: the diagnosis verdict ("fragmentation", "borderline", "shortage", "unknown"),
            or "undiagnosed" when no diagnosis could be made.
        reason: the diagnosis summary, or why there is none.
        snapshot: the snapshot file written, None when none could be.
        budget: bytes the run could use (the recorded cap, else the diagnosis's budget), None if unknown.
        command: the training command, as `sys.argv` held it.
    """

    verdict: str
    reason: str
    snapshot: Path | None
    budget: int | None
    command: tuple[str, ...]

    def next_commands(self) -> list[str]:
        """What to run next: where the memory went (needs the snapshot), then a tuned setting."""
        budget = f"{self.budget}B" if self.budget else "SIZE"
        cmd = "python " + shlex.join(self.command) if self.command else "CMD"
        steps = [f"alloctune explain {shlex.quote(str(self.snapshot))}"] if self.snapshot else []
        return steps + [f"alloctune tune --budget {budget} -- {cmd}"]

    def line(self) -> str:
        """One line, verdict first, so a log search for the verdict finds it."""
        reason = " ".join(self.reason.split())  # a summary never breaks the line
        where = f"snapshot {self.snapshot}; " if self.snapshot else ""
        return f"{self.verdict}: {reason} [alloctune] {where}next: {' ; '.join(self.next_commands())}"


class OOMRecorder:
    """Allocator history for one training run, and the report of an OOM that ends it.

    `backend`: the CUDA operations (default `TorchCuda`; a fake drives it without a GPU).
    `stream`: where the one line goes (default `sys.stderr`). `command`: the command to tune
    (default `sys.argv`).
    """

    def __init__(
        self,
        out_dir: str | Path = ".",
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        stacks: str = "python",
        backend: CudaBackend | None = None,
        stream: TextIO | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise InputError(f"max_entries must be a whole number of 1 or more, got {max_entries!r}")
        if stacks not in STACKS:
            raise InputError(f"stacks must be one of {', '.join(STACKS)}, got {stacks!r}")
        out = Path(out_dir)
        if out.exists() and not out.is_dir():
            raise InputError(f"{out}: exists and is not a directory; give a directory for the OOM snapshots")
        self.out_dir = out
        self.max_entries = max_entries
        self.stacks = stacks
        self.backend: CudaBackend = backend if backend is not None else TorchCuda()
        self.stream = stream
        self.command = tuple(str(a) for a in (sys.argv if command is None else command))
        self.recording = False
        self.notes: list[OOMNote] = []  # one per OOM reported, newest last

    def start(self) -> bool:
        """Record the history from now on when CUDA is available; True when recording.

        Under alloctune's agent (`alloctune run` / `record` / `tune` set `ALLOCTUNE_AGENT`) the
        agent owns the history: starting it here would change its length and stopping it at the
        end of training would empty the recording the agent writes at exit.
        """
        if os.environ.get(AGENT_ENV_VAR):
            return False
        if not self.recording and self.backend.available():
            self.backend.start_history(self.max_entries, self.stacks)
            self.recording = True
        return self.recording

    def stop(self) -> None:
        """Stop a recording this recorder started (another's is left alone)."""
        if self.recording:
            self.recording = False
            self.backend.stop_history()

    def snapshot_with_record(self) -> dict[str, Any]:
        """The allocator's snapshot with the run record under the agent's key."""
        snap = dict(self.backend.snapshot())
        snap[RUN_RECORD_KEY] = run_record(self.backend.limits(), self.backend.torch_version(), self.command)
        return snap

    def report_oom(self, exc: BaseException) -> OOMNote:
        """Write the snapshot, diagnose it and print the one line; never raises (the OOM must propagate)."""
        path: Path | None = None
        record: dict[str, Any] = {}
        try:
            if not self.backend.available():
                raise _NoHistory("no allocator history to diagnose: CUDA is not available in this process")
            snap = self.snapshot_with_record()
            record = snap[RUN_RECORD_KEY]
            path = write_snapshot(snap, self.out_dir)
            note = self._diagnosed(path, record)
        except Exception as problem:  # noqa: BLE001 - any failure here must leave the OOM to propagate
            reason = str(problem) if isinstance(problem, _NoHistory) else f"{type(problem).__name__}: {problem}"
            cap = record.get("cap") or None
            note = OOMNote(UNDIAGNOSED, f"{reason} (after {_first_line(exc)})", path, cap, self.command)
        self.notes.append(note)
        try:
            print(note.line(), file=self.stream if self.stream is not None else sys.stderr, flush=True)
        except (OSError, ValueError):  # a closed or broken stream: the note stays in `notes`
            pass
        return note

    def _diagnosed(self, path: Path, record: dict[str, Any]) -> OOMNote:
        from alloctune.api import diagnose_snapshot

        try:
            diagnosis = diagnose_snapshot(str(path))
        except Exception as problem:  # noqa: BLE001 - e.g. no `oom` entry (a cuBLAS OOM): say so, keep the file
            return OOMNote(UNDIAGNOSED, f"{type(problem).__name__}: {problem}", path, record.get("cap") or None, self.command)
        budget = record.get("cap") or diagnosis.budget
        return OOMNote(diagnosis.verdict, diagnosis.summary, path, budget, self.command)


class _NoHistory(Exception):
    """No snapshot can be taken (no CUDA): the reason itself is the message."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:160]}" if text else type(exc).__name__


def write_snapshot(snap: dict[str, Any], out_dir: Path) -> Path:
    """Pickle `snap` (plain data, as torch's `_dump_snapshot` does) to a new file in `out_dir`.

    Named as the agent names its OOM snapshots, `oom-snapshot.PID.pickle`; a second OOM in the
    same process gets `-2`, `-3`, ... instead of overwriting the first.
    """
    import pickle  # writing our own plain-data dict; only reading pickles is dangerous

    out_dir.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        suffix = "" if n == 1 else f"-{n}"
        path = out_dir / f"oom-snapshot.{os.getpid()}{suffix}.pickle"
        try:
            with open(path, "xb") as fh:
                pickle.dump(snap, fh)
            return path
        except FileExistsError:
            n += 1


@contextmanager
def oom_guard(recorder: OOMRecorder) -> Iterator[OOMRecorder]:
    """Report an OOM raised inside the block, then let it propagate unchanged; stop recording on the way out.

    Only real out-of-memory errors are reported (`alloctune.guard.is_oom`: torch's
    `OutOfMemoryError` or a CUDA library's allocation-failure status); others pass untouched.
    """
    try:
        yield recorder
    except BaseException as exc:
        if is_oom(exc):
            recorder.report_oom(exc)
        raise
    finally:
        recorder.stop()
