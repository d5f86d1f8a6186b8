"""Probe alloctune with hostile and damaged inputs; print the table of issue #19 and write bench/results/hostile.md.

Classes: pickles that would run code, nesting (depth) bombs, memo-index bombs, decompression bombs,
"billion laughs", damaged real snapshots, wrong values in well-formed snapshots, corrupted compact
traces, torn/damaged result stores, kill -9 during `tune`, kill -9 / SIGTERM / SIGHUP of `run`.

Each file probe runs the real CLI entry point (`alloctune.cli.main`) in a forked child under
RLIMIT_AS (`--mem`, default 2 GiB) and a wall-clock limit (`--timeout`), and is counted as:
handled cleanly (exit 0, or exit 2 with one `alloctune: error:` line), crash (signal, traceback,
"internal error", exit 1), over the memory limit (MemoryError / killed by the limit), code executed
(the payload's marker file exists). Store probes count complete trials that a resume does not load
(trials lost); kill probes count workload processes alive 15 s after alloctune died (orphans) and
finished trials lost or run twice.

    PYTHONPATH=src:tests python bench/hostile.py [--quick] [--mem 2GiB] [--out bench/results/hostile.md]

CPU only, no GPU; about 3 minutes (--quick: under 1).
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import lzma
import os
import pickle
import platform
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from runlog import command, log_result, md_table
from suite import ROOT, SHARED, SHIPPED

sys.path.insert(0, str(ROOT / "tests"))
import hostile_probes as hp  # noqa: E402 - tests/ is on the path now
from alloctune.units import parse_size  # noqa: E402


@dataclass
class Row:
    name: str
    tried: int = 0
    clean: int = 0
    crashes: int = 0
    memory: int = 0
    timeouts: int = 0
    code: int = 0
    lost: int = 0
    orphans: int = 0
    notes: list[str] = field(default_factory=list)

    def count(self, verdict: str, what: str) -> None:
        self.tried += 1
        counter = {"clean": "clean", "memory": "memory", "timeout": "timeouts"}.get(verdict, "crashes")
        setattr(self, counter, getattr(self, counter) + 1)
        if verdict != "clean" and len(self.notes) < 3:
            self.notes.append(f"{what}: {verdict}")


# ---- running the CLI in a forked child --------------------------------------------------------------
def run_forked(args: list[str], mem: int, timeout: float, env: dict | None = None) -> hp.Outcome:
    """`alloctune ARGS` in a fork of this process (no interpreter start-up) under RLIMIT_AS."""
    err = tempfile.TemporaryFile()
    out = tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            os.environ.update(env or {})
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), write_through=True)
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
            from alloctune.cli import main

            try:
                main(args)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        except MemoryError:
            os.write(2, b"MemoryError\n")
            os._exit(1)
        except BaseException as exc:  # noqa: BLE001 - report anything as a crash
            os.write(2, f"Traceback: {type(exc).__name__}: {exc}\n".encode())
            os._exit(1)
    end = time.monotonic() + timeout
    status = None
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return hp.Outcome(-9, "", "", timed_out=True)
    err.seek(0)
    out.seek(0)
    rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return hp.Outcome(rc, out.read().decode(errors="replace"), err.read().decode(errors="replace"))


# ---- file probes ------------------------------------------------------------------------------------------
def file_probes(tmp: Path, quick: bool) -> dict[str, list[tuple[str, bytes]]]:
    rng = random.Random(19)
    marker = tmp / "pwned"
    probes: dict[str, list[tuple[str, bytes]]] = {}
    probes["code-running pickles"] = [(n, b) for n, b in hp.code_pickles(marker)]
    probes["nesting bombs"] = [
        ("tuple1-key-1e6.xz", hp.tuple1_bomb()),
        ("tuple1-key-1e5.xz", hp.tuple1_bomb(100_000)),
        ("tuple1-top-1e6.xz", lzma.compress(b"\x80\x04}" + b"\x85" * 1_000_000 + b".")),
        ("lists-1e5", b"\x80\x04" + b"](" * 100_000 + b"e" * 100_000 + b"."),
        ("mark-tuples-1e5", b"\x80\x04" + b"(" * 100_000 + b"N" + b"t" * 100_000 + b"."),
        ("frozenset-1e4", b"\x80\x04" + b"(" * 10_000 + b"N" + b"\x91" * 10_000 + b"."),
        ("dict-key-tuple3-1e5", b"\x80\x04}NN" + b"NN\x87" * 100_000 + b"Ns."),
    ]
    probes["memo bombs"] = [
        ("long_binput-2^32-16", hp.memo_bomb()),
        ("long_binput-1e9", b"\x80\x04N\x72" + (10**9).to_bytes(4, "little") + b"."),
        ("put-text-1e12", b"N\np1000000000000\n."),
        ("binput-then-get-missing", b"\x80\x04Nq\x05h\x06."),
        ("frame-2^63", b"\x80\x04\x95" + (2**63 - 1).to_bytes(8, "little") + b"N."),
        ("binunicode8-2^40", b"\x80\x04\x8d" + (2**40).to_bytes(8, "little") + b"abc."),
    ]
    import bz2

    probes["decompression bombs"] = [
        ("xz-1GiB-zeros", hp.xz_bomb()),
        ("gzip-512MiB-zeros", hp.gzip_bomb(total=512 * hp.MiB)),
        ("bz2-200MiB-zeros", bz2.compress(b"\0" * (200 * hp.MiB), 9)),
        ("xz-truncated", hp.xz_bomb(64 * hp.MiB)[:-7]),
    ]
    probes["billion laughs"] = [(f"laughs-{lv}", hp.billion_laughs(levels=lv)) for lv in (3, 5, 7, 9, 12)]
    probes["billion laughs"].append(("cycle", hp.cycle()))
    bad = [(n, lzma.compress(pickle.dumps(s))) for n, s in hp.bad_value_snapshots()]
    probes["wrong values in snapshots"] = bad
    real = SHARED / "rvc_ec1" / "default.pickle.xz"
    base = lzma.decompress(real.read_bytes()) if real.exists() else pickle.dumps(hp.plain_snapshot(400))
    n_damage = 12 if quick else 60
    probes["damaged snapshots"] = [(f"mut{i}", lzma.compress(hp.mutated(base, rng, rng.randint(1, 6)), preset=0))
                                   for i in range(n_damage)]
    probes["damaged snapshots"] += [(f"cut{i}", lzma.compress(base[: rng.randrange(len(base))], preset=0))
                                    for i in range(n_damage // 4)]
    return probes


def compact_probes(quick: bool) -> list[tuple[str, bytes]]:
    from alloctune.trace.compact import to_compact_dict
    from alloctune.trace.load import load_trace

    rng = random.Random(7)
    src = SHIPPED / "rvc_h200_ec1.atrace"
    trace = load_trace(src)
    good = src.read_bytes()
    body = to_compact_dict(trace)
    out = []
    for i in range(8 if quick else 30):  # byte damage in the xz container
        out.append((f"xzbyte{i}", hp.mutated(good, rng, rng.randint(1, 3))))
    req = body["requests"]
    for i in range(10 if quick else 50):  # content edits with a valid checksum
        b = json.loads(json.dumps(body))
        r = b["requests"]
        col = rng.choice(["sizes", "free_back", "event_index_delta", "streams_ops", "n", "total_memory", "seg"])
        if col == "n":
            r["n"] = rng.choice([-1, 0, 10**9, "x"])
        elif col == "total_memory":
            b["total_memory"] = rng.choice([-1, 0, 1, "x", 10**20])
        elif col == "streams_ops":
            k = rng.randrange(len(r["ops"]))
            r["ops"] = r["ops"][:k] + rng.choice("2379x") + r["ops"][k + 1:]
        elif col == "seg":
            s = b["segment_events"]
            if s["size"]:
                s["size"][rng.randrange(len(s["size"]))] = rng.choice([-1, 10**15, None])
        else:
            arr = r[col]
            arr[rng.randrange(len(arr))] = rng.choice([-1, 10**15, 2**64, None, "7", 1.5, 10**6])
        out.append((f"edit{i}-{col}", hp.recompress_with(b)))
    out.append(("stale-checksum", hp.recompress_with({**body, "total_memory": 1}, fix_checksum=False)))
    out.append(("truncated", good[: len(good) // 2]))
    del req
    return out


# ---- stores ------------------------------------------------------------------------------------------------
def store_probes(tmp: Path, row: Row, quick: bool) -> None:
    from alloctune.tune.candidates import parse_knobs
    from alloctune.tune.store import TrialStore
    from alloctune.tune.strategy import Tuner, TuneSettings
    from tune_fakes import COMMAND, FakeEvaluator, MiB

    path = tmp / "base.jsonl"
    with TrialStore(path, COMMAND) as store:
        Tuner(FakeEvaluator(), TuneSettings(command=COMMAND, budget=2600 * MiB,
                                            knobs=parse_knobs(["expandable", "roundup"])), store=store).run()
    lines = path.read_bytes().splitlines(keepends=True)
    rng = random.Random(5)
    variants = [("no-final-newline", b"".join(lines)[:-1], len(lines) - 1)]
    for cut in sorted(rng.sample(range(1, len(lines[-1]) - 1), 6 if quick else 25)):
        variants.append((f"torn-at-{cut}", b"".join(lines[:-1]) + lines[-1][:cut], len(lines) - 2))
    for junk in (b"[1]", b"42", b'{"kind":"x"}', b"null", b'{"kind":"trial","schema":1}', b"\x00\xff"):
        variants.append((f"junk-{junk[:6]!r}", b"".join(lines[:2]) + junk + b"\n" + b"".join(lines[2:]),
                         len(lines) - 1))
    variants.append(("lost-header", b"".join(lines[1:]), len(lines) - 1))
    variants.append(("header-overwritten", b'{"kind":"header","command":"zzz"\n' + b"".join(lines[1:]),
                     len(lines) - 1))
    for name, data, complete in variants:
        p = tmp / f"{name}.jsonl"
        p.write_bytes(data)
        try:
            with TrialStore(p, COMMAND, resume=True) as s:
                kept = len(s)
            row.count("clean", name)
            row.lost += max(0, complete - kept)
        except Exception as exc:  # noqa: BLE001
            row.count("crash", f"{name}: {type(exc).__name__}: {exc}")


# ---- kills -------------------------------------------------------------------------------------------------


def alive_pids(pids: list[int]) -> list[int]:
    from alloctune.run.process import pid_alive

    return [p for p in pids if pid_alive(p)]


def kill_run_probes(tmp: Path, row: Row, quick: bool) -> None:
    work = tmp / "sleeper.py"
    work.write_text(
        "import os, subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']).pid]\n"
        "open(sys.argv[1] + '.t', 'w').write(' '.join(map(str, [os.getpid()] + kids)))\n"
        "os.replace(sys.argv[1] + '.t', sys.argv[1])\n"
        "time.sleep(120)\n")
    env = hp.cli_env({"TMPDIR": str(tmp), "HOME": str(tmp / "home")})
    sigs = [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP] * (1 if quick else 2)
    for i, sig in enumerate(sigs):
        marker = tmp / f"run{i}.pids"
        proc = subprocess.Popen([sys.executable, "-m", "alloctune", "run", "--", sys.executable, str(work),
                                 str(marker)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        end = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < end:
            time.sleep(0.05)
        pids = [int(x) for x in marker.read_text().split()] if marker.exists() else []
        time.sleep(random.Random(i).uniform(0.1, 1.0))
        proc.send_signal(sig)
        proc.wait(timeout=30)
        time.sleep(15 if sig == signal.SIGKILL else 3)
        left = alive_pids(pids)
        row.orphans += len(left)
        for p in left:
            os.kill(p, signal.SIGKILL)
        row.count("clean" if pids and not left else "crash", f"run {sig.name}")


def kill_tune_probes(tmp: Path, row: Row, quick: bool) -> None:
    """kill -9 of `tune` mid-sweep (fake-CUDA workload), then --resume: count orphans, lost or repeated trials."""
    from fake_torch import install

    install(tmp / "fake")
    work = tmp / "w.py"
    work.write_text("import os, time, torch\n"
                    "open(os.environ['PIDS'], 'a').write(f'{os.getpid()}\\n')\n"
                    "torch.cuda.fake_alloc(400 << 20)\n"
                    "if 'expandable_segments:True' not in os.environ.get('PYTORCH_CUDA_ALLOC_CONF', ''):\n"
                    "    torch.cuda.fake_alloc(300 << 20)\n"
                    "time.sleep(0.4)\n"
                    "print('throughput: 50 items/s')\n")
    on_disk = reused_total = 0
    for i in range(3 if quick else 10):
        store = tmp / f"t{i}.jsonl"
        pids = tmp / f"t{i}.pids"
        env = hp.cli_env({"TMPDIR": str(tmp), "HOME": str(tmp / "home"), "PIDS": str(pids),
                          "ALLOCTUNE_STATE_DIR": str(tmp / "live")})
        env["PYTHONPATH"] = str(tmp / "fake") + os.pathsep + env["PYTHONPATH"]
        cmd = [sys.executable, "-m", "alloctune", "tune", "--budget", "800MiB", "--knobs", "expandable,roundup",
               "--store", str(store)]
        proc = subprocess.Popen(cmd + ["--", sys.executable, str(work)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(random.Random(i).uniform(1.5, 6.0))
        proc.kill()
        proc.wait()
        time.sleep(5)
        started = [int(x) for x in pids.read_text().split()] if pids.exists() else []
        left = alive_pids(started)
        row.orphans += len(left)
        for p in left:
            os.kill(p, signal.SIGKILL)
        finished = [json.loads(x) for x in store.read_text().splitlines()
                    if x.strip().startswith("{") and '"kind":"trial"' in x] if store.exists() else []
        from collections import Counter

        def ident(d: dict) -> tuple:
            return (d.get("conf"), d.get("budget"), d.get("repeat", 0))

        done = Counter(ident(t["key"]) for t in finished if t["result"]["outcome"] in ("ok", "oom"))
        res = subprocess.run(cmd + ["--resume", "--json", "--", sys.executable, str(work)], env=env,
                             capture_output=True, text=True, timeout=300)
        ok = res.returncode == 0
        if ok:
            trials = json.loads(res.stdout).get("trials", [])
            reused = Counter(ident(t) for t in trials if t.get("reused"))
            fresh = Counter(ident(t) for t in trials if not t.get("reused"))
            lost, repeated = sum((done - reused).values()), sum((fresh & done).values())
            on_disk += sum(done.values())
            reused_total += sum(reused.values())
            row.lost += lost + repeated
            if lost or repeated:
                row.notes.append(f"tune kill {i}: {lost} lost, {repeated} run twice")
        row.count("clean" if ok and not left else "crash", f"tune kill {i}: rc {res.returncode} {res.stderr[-200:]}")
    row.notes.append(f"{on_disk} finished trials were on disk at the kills; --resume reused {reused_total}")


# ---- main --------------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mem", default="2GiB")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "hostile.md"))
    args = ap.parse_args()
    mem = parse_size(args.mem)
    os.environ["ALLOCTUNE_CACHE"] = "0"  # every probe loads its file for real (no trace cache hits or entries)
    t0 = time.monotonic()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="alloctune-hostile-") as d:
        tmp = Path(d)
        marker = tmp / "pwned"
        commands = [["trace", "info"], ["simulate"], ["diagnose", "--snapshot"]]
        for cls, items in file_probes(tmp, args.quick).items():
            row = Row(cls)
            for name, blob in items:
                path = tmp / f"{name}.pickle"
                path.write_bytes(blob)
                for cmd in (commands if cls != "damaged snapshots" else [commands[0], commands[2]]):
                    out = run_forked([*cmd, str(path)], mem, args.timeout)
                    row.count(hp.verdict(out), f"{' '.join(cmd)} {name}")
                if marker.exists():
                    row.code += 1
                    marker.unlink()
            rows.append(row)
            print(f"{cls}: {row.clean}/{row.tried} clean", file=sys.stderr)
        row = Row("corrupted compact traces")
        for name, blob in compact_probes(args.quick):
            path = tmp / f"{name}.atrace"
            path.write_bytes(blob)
            for cmd in (["trace", "info"], ["simulate"]):
                out = run_forked([*cmd, str(path)], mem, args.timeout)
                row.count(hp.verdict(out), f"{' '.join(cmd)} {name}")
        rows.append(row)
        print(f"compact: {row.clean}/{row.tried} clean", file=sys.stderr)
        for name, probes in (("damaged result stores", store_probes), ("kill -9 / TERM / HUP of run", kill_run_probes),
                             ("kill -9 of tune, then --resume", kill_tune_probes)):
            rows.append(Row(name))
            probes(tmp, rows[-1], args.quick)
            print(f"{name}: {rows[-1].clean}/{rows[-1].tried}", file=sys.stderr)
    elapsed = time.monotonic() - t0
    counts = ("tried", "clean", "crashes", "memory", "timeouts", "code", "lost", "orphans")
    total = Row("**total**", **{f: sum(getattr(r, f) for r in rows) for f in counts})
    table = md_table(("probe class", "inputs tried", "handled cleanly", "crashes", "over the memory limit", "timeouts",
                      "code executed", "trials lost", "orphaned workloads"),
                     [(r.name, *(getattr(r, f) for f in counts)) for r in [*rows, total]])
    notes = [f"- {r.name}: " + "; ".join(r.notes) for r in rows if r.notes]
    print(table)
    if notes:
        print("\n".join(notes))
    md = (f"## Hostile and damaged input ({dt.date.today().isoformat()}, {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, RLIMIT_AS {args.mem}, {elapsed:.0f} s)\n\n"
          f"Command: `PYTHONPATH=src:tests {command()}`. File probes run `trace info`, `simulate` and `diagnose --snapshot` "
          "(damaged snapshots: `trace info` and `diagnose --snapshot`; compact traces: `trace info` and `simulate`) in a "
          "forked child; clean = exit 0, or exit 2 with one `alloctune: error:` line.\n\n" + table + "\n"
          + ("\n" + "\n".join(notes) + "\n" if notes else ""))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    print(f"written {out}", file=sys.stderr)
    for r in [*rows, total]:
        log_result(f"{r.name}: {r.clean}/{r.tried} clean ({r.crashes} crashes, {r.memory} memory, {r.timeouts} "
                   f"timeouts, {r.lost} lost, {r.orphans} orphans)", folder=out.parent)


if __name__ == "__main__":
    main()
