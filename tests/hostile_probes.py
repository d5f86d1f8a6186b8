"""Hostile and damaged inputs, built in code (no binary fixtures), for tests/test_hostile_*.py.

Each builder returns bytes; `run_cli` runs the real console entry point in a child process under
an address-space limit (RLIMIT_AS) and a wall-clock limit, and `verdict` classifies what happened
the way the issue counts it: handled cleanly (exit 0, or exit 2 with one `alloctune: error:` line),
crash (a signal, a traceback, "internal error", exit 1), over the memory limit, timeout.
"""

from __future__ import annotations

import gzip
import json
import lzma
import os
import pickle
import random
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
GiB = 1 << 30
PY = sys.executable


# ---- pickles ------------------------------------------------------------------------------------
def tuple1_bomb(deep: int = 1_000_000) -> bytes:
    """A dict, then a million TUPLE1 wrapping a key, then SETITEM: hashing the key overflows the C stack.

    xz-compressed this is under 300 bytes; `pickle.loads` dies with SIGSEGV on it.
    """
    return lzma.compress(b"\x80\x04}N" + b"\x85" * deep + b"Ns.")


def memo_bomb() -> bytes:
    """9 bytes: LONG_BINPUT at index 2**32-16 (the C unpickler grows its memo table to that size)."""
    return b"\x80\x04N\x72\xf0\xff\xff\xff."


def billion_laughs(levels: int = 9, width: int = 10) -> bytes:
    """`allocator_settings` = a list of 10 refs to a list of 10 refs ... (10**9 leaves), a few hundred bytes."""
    p = bytearray(b"\x80\x04]\x94(" + b"K\x01" * width + b"e0")  # level 0 = memo 0
    for level in range(1, levels + 1):  # level i = memo i: `width` references to level i-1
        p += b"]\x94(" + (b"h" + bytes([level - 1])) * width + b"e0"
    p += b"}(\x8c\x0ddevice_traces]]a\x8c\x12allocator_settingsh" + bytes([levels]) + b"u."
    return bytes(p)


def cycle() -> bytes:
    """device_traces = L where L contains itself (a cycle: any walk of it never ends)."""
    return b"\x80\x04}\x94\x8c\x0ddevice_traces\x94]\x94h\x02as."


class RunsShell:
    """A classic malicious payload: unpickling calls os.system(cmd)."""

    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def code_pickles(marker: Path) -> list[tuple[str, bytes]]:
    """Pickles that would run `touch marker` if anything executed them."""
    out = []
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        out.append((f"reduce-p{proto}", pickle.dumps({"device_traces": [[RunsShell(f"touch {marker}")]]},
                                                      protocol=proto)))
    cmd = f"touch {marker}".encode()
    out.append(("global-reduce", b"cos\nsystem\n(S'" + cmd + b"'\ntR."))
    out.append(("inst", b"(S'" + cmd + b"'\nios\nsystem\n."))
    out.append(("stack-global", b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c" + bytes([len(cmd)]) + cmd + b"\x85R."))
    out.append(("obj", b"\x80\x02(cos\nsystem\nS'" + cmd + b"'\no."))
    out.append(("persid", b"\x80\x02X\x03\x00\x00\x00abcQ."))
    out.append(("ext", b"\x80\x02\x82\x01."))
    return out


def plain_snapshot(n: int = 40, total: int = 80 * GiB) -> dict:
    """A small consistent history: n allocs then their frees, one segment."""
    base = 0x7F0000000000
    events = [{"action": "segment_alloc", "addr": base, "size": 64 * MiB, "stream": 0}]
    for i in range(n):
        events.append({"action": "alloc", "addr": base + i * MiB, "size": 512 * (i + 1), "stream": 0})
    for i in range(n):
        events.append({"action": "free_completed", "addr": base + i * MiB, "size": 512 * (i + 1), "stream": 0})
    return {"device_traces": [events], "allocator_settings": {"max_split_size": -1, "PYTORCH_CUDA_ALLOC_CONF": ""},
            "segments": []}


def bad_value_snapshots() -> list[tuple[str, dict]]:
    """Well-formed pickles whose data is wrong: each must be refused with one line."""
    out = []
    for name, key, value in [("negative-size", "size", -5), ("huge-size", "size", 200 * 10**12),
                             ("float-size", "size", 1.5), ("bool-size", "size", True),
                             ("str-addr", "addr", "0x10"), ("unknown-action", "action", "alloc2"),
                             ("dict-action", "action", {"a": 1}), ("list-stream", "stream", [0])]:
        snap = plain_snapshot()
        snap["device_traces"][0][3] = dict(snap["device_traces"][0][3], **{key: value})
        out.append((name, snap))
    nested = plain_snapshot()
    nested["allocator_settings"] = {"x": [[1, 2], [3]]}
    out.append(("nested-settings", nested))
    for name, segments in [("segment-not-dict", [7]),
                           ("negative-block", [{"address": 0, "total_size": 2 * MiB,
                                                "blocks": [{"size": -1, "state": "active_allocated"}]}]),
                           ("segments-dict", {"a": 1})]:
        snap = plain_snapshot()
        snap["segments"] = segments
        out.append((name, snap))
    return out


def mutated(data: bytes, rng: random.Random, edits: int = 3) -> bytes:
    """`data` with a few random bytes changed, inserted or cut (a damaged download)."""
    b = bytearray(data)
    for _ in range(edits):
        kind = rng.random()
        pos = rng.randrange(len(b)) if b else 0
        if kind < 0.6 and b:
            b[pos] = rng.randrange(256)
        elif kind < 0.8:
            b[pos:pos] = bytes([rng.randrange(256)])
        else:
            del b[pos:]
    return bytes(b)


# ---- compressed bombs ---------------------------------------------------------------------------
def xz_bomb(total: int = 1 * GiB, piece: int = 16 * MiB) -> bytes:
    """Concatenated xz streams of zeros: a few hundred KB that decompress to `total` bytes."""
    one = lzma.compress(b"\0" * piece, preset=0)
    return one * (total // piece)


def gzip_bomb(total: int = 1 * GiB, piece: int = 16 * MiB) -> bytes:
    one = gzip.compress(b"\0" * piece, compresslevel=1)
    return one * (total // piece)


# ---- compact traces -----------------------------------------------------------------------------
def compact_bytes(trace) -> bytes:
    from alloctune.trace.compact import encode

    return lzma.compress(encode(trace), preset=0)


def recompress_with(body: dict, fix_checksum: bool = True) -> bytes:
    """A schema-2 file around an edited JSON body (with a correct or stale checksum)."""
    import hashlib

    text = json.dumps(body, separators=(",", ":")).encode()
    digest = hashlib.sha256(text if fix_checksum else b"other").hexdigest()
    return lzma.compress(f"alloctune-trace 2 sha256={digest} bytes={len(text)}\n".encode() + text, preset=0)


# ---- running the CLI -----------------------------------------------------------------------------
def cli_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("ALLOCTUNE_DEBUG", None)
    env["ALLOCTUNE_CACHE"] = "0"  # every probe loads its file for real (and leaves no cache entry behind)
    env.update(extra or {})
    return env


def _limit_memory(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


@dataclass
class Outcome:
    rc: int
    stdout: str
    stderr: str
    timed_out: bool = False


def run_cli(args: list[str], *, mem: int = 2 * GiB, timeout: float = 60.0, env: dict | None = None,
            stdin: str | None = None) -> Outcome:
    """`python -m alloctune ARGS` under RLIMIT_AS=`mem` and a wall-clock limit."""
    try:
        res = subprocess.run([PY, "-m", "alloctune", *args], capture_output=True, text=True, timeout=timeout,
                             env=cli_env(env), preexec_fn=_limit_memory(mem), input=stdin)
    except subprocess.TimeoutExpired as exc:
        return Outcome(-9, exc.stdout or "", exc.stderr or "", timed_out=True)
    return Outcome(res.returncode, res.stdout, res.stderr)


def verdict(out: Outcome) -> str:
    """'clean' | 'crash' | 'memory' | 'timeout' (see module doc)."""
    if out.timed_out:
        return "timeout"
    err = out.stderr if isinstance(out.stderr, str) else out.stderr.decode(errors="replace")
    if "MemoryError" in err or "Cannot allocate memory" in err:
        return "memory"
    if out.rc < 0 or "Traceback" in err or "internal error" in err:
        return "crash"
    if out.rc == 0:
        return "clean"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if out.rc == 2 and len(lines) == 1 and lines[0].startswith("alloctune: error: "):
        return "clean"
    return "crash"


def wait_for(path: Path, timeout: float = 30.0) -> list[int]:
    """The pids a workload wrote to `path` once it is up (an AssertionError if it never comes)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            return [int(x) for x in path.read_text().split()]
        time.sleep(0.1)
    raise AssertionError(f"the workload never started ({path} missing)")


def gone(pids: list[int], timeout: float = 15.0) -> bool:
    """Whether every process in `pids` has ended within `timeout` seconds (the runner's own pid check)."""
    from alloctune.run.process import pid_alive

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(pid_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False
