"""How fast `alloctune diagnose` reads a log of many OOM messages: MB/s, linearity, peak memory.

Generates logs of *distinct* OOM messages (the real message forms of
/work/shared/oom-messages/corpus.jsonl with every size and device number varied, each line
prefixed `[rankN] step K:` as a multi-rank job prints them) at 10, 40 and 80 MB, and a mixed
log (OOM messages among ordinary training-log lines). Each log is diagnosed by the real CLI in a
fresh process: the terminal rendering written to a file, and `--json`, each as a user runs it
(ALLOCTUNE_WORKERS unset) and in one process (ALLOCTUNE_WORKERS=1); the 80 MB log once more
through stdin. The count of messages the CLI reports is checked against the count generated
(an independent fact: the generator knows how many it wrote). Peak memory is the child's
maximum resident set size.

Then the first load of two ~70 MB snapshots (bench/snapshot_load.py's generated `events` and
`stacks`), plain `pickle.load` against the safe load and the opcode scan + load, as ratios.

    python bench/diagnose_speed.py [--sizes 10,40,80] [--mixed 40] [--snapshot-mb 70] [--reps 3]

Appends the table as a dated section to --out, its rows to the .json beside it, one line per
headline figure to bench/results/LOG.md (runlog.log_result), then rebuilds bench/results/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "oom-messages" / "corpus.jsonl"
SCHEMA = "alloctune.bench.diagnose_speed/1"
MB = 1_000_000

_SIZE = re.compile(r"(\d+(?:\.\d+)?)(\s*)(bytes|[KMGT]i?B)\b")
_DEV = re.compile(r"\b(GPU|NPU|XPU)( ?)(\d+)")


def message_forms() -> list[str]:
    """The distinct message texts of the corpus (one per form; each is varied when used)."""
    sys.path.insert(0, str(ROOT / "src"))
    from alloctune.diagnose import find_reports

    forms: dict[str, str] = {}
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        for r in find_reports(json.loads(line)["text"]):
            if r.requested is not None and not r.truncated:  # complete messages: they name a size
                forms.setdefault(r.format + ("-multiline" if "\n" in r.raw else ""), r.raw)
                forms.setdefault(_SIZE.sub("#", r.raw), r.raw)
    return list(forms.values())


def varied(form: str, rnd: random.Random, rank: int) -> str:
    def size(m: re.Match[str]) -> str:
        num = m.group(1)
        decimals = len(num.split(".")[1]) if "." in num else 0
        value = rnd.uniform(1, 999) if m.group(3) != "bytes" else rnd.randrange(0, 1024)
        return f"{value:.{decimals}f}{m.group(2)}{m.group(3)}"

    return _DEV.sub(lambda m: f"{m.group(1)}{m.group(2)}{rank}", _SIZE.sub(size, form))


def write_log(path: Path, size: int, forms: list[str], *, mixed: bool, seed: int) -> int:
    """A log of about `size` bytes; returns how many OOM messages it holds."""
    rnd = random.Random(seed)
    n = written = step = 0
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        while written < size:
            step += 1
            rank = rnd.randrange(8)
            if mixed and step % 40:
                line = (f"2026-01-01 12:{step // 60 % 60:02d}:{step % 60:02d} INFO [rank{rank}] step {step} "
                        f"loss={rnd.random():.4f} lr=3e-4 tokens/s={rnd.randrange(1000, 9000)} "
                        f"mem={rnd.uniform(1, 80):.2f}GiB /home/u/train.py:{rnd.randrange(900)}\n")
            else:
                line = f"[rank{rank}] step {step}: torch.OutOfMemoryError: " + varied(rnd.choice(forms), rnd, rank) + "\n"
                n += 1
            fh.write(line)
            written += len(line.encode("utf-8"))
    return n


def run(args: list[str], stdin_path: Path | None = None, workers: int | None = None) -> tuple[float, int, bytes]:
    """Wall seconds, peak RSS (bytes; the largest process's, workers included) and stdout of
    `alloctune ARGS` in a fresh process; `workers`: ALLOCTUNE_WORKERS (None: unset, the default a
    user gets: this process and one per idle CPU for a log longer than the first chunk)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "120"}
    env.pop("ALLOCTUNE_WORKERS", None)
    if workers is not None:
        env["ALLOCTUNE_WORKERS"] = str(workers)
    with tempfile.TemporaryFile() as out:
        stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
        try:
            t = time.perf_counter()
            p = subprocess.Popen([sys.executable, "-m", "alloctune", *args], stdin=stdin, stdout=out,
                                 stderr=subprocess.PIPE, env=env)
            _, status, usage = os.wait4(p.pid, 0)  # ru_maxrss: the child, or a worker it reaped, if larger
            wall = time.perf_counter() - t
            p.returncode = os.waitstatus_to_exitcode(status)
            err = p.stderr.read().decode() if p.stderr else ""
        finally:
            if stdin_path:
                stdin.close()
        if p.returncode != 0:
            raise SystemExit(f"diagnose_speed: alloctune {' '.join(args)} failed ({p.returncode}): {err.strip()}")
        out.seek(0)
        return wall, usage.ru_maxrss * 1024, out.read()


def messages_in(stdout: bytes, json_out: bool) -> int:
    if json_out:
        return json.loads(stdout)["messages"]
    m = re.search(rb"([\d,]+) out-of-memory messages", stdout)
    return int(m.group(1).replace(b",", b"")) if m else -1


def snapshot_rows(size_mb: int, reps: int, tmp: Path) -> list[dict]:
    """First load of generated snapshots (bench/snapshot_load.py builds them from the shared recordings):
    plain `pickle.load`, the safe load alloctune runs, the opcode scan + load, the restricted load
    alone; best of `reps` fresh processes, the methods taking turns."""
    sys.path.insert(0, str(ROOT / "bench"))
    import snapshot_load as sl

    rows = []
    for name, build in (("events", sl.build_events), ("stacks", sl.build_stacks)):
        path = tmp / f"{name}.pickle"
        build(path, size_mb * MB)
        load = os.getloadavg()[0]
        got = sl.measure_all(path, reps)
        row = {"snapshot": f"{name} ({path.stat().st_size / MB:.1f} MB)", "load_avg": round(load, 2),
               **{m: {k: round(v, 3) if isinstance(v, float) else v for k, v in got[m].items()} for m in got}}
        for m in ("safe", "scan", "nocheck"):
            row[f"{m}_cpu_x"] = round(got[m]["cpu"] / got["plain"]["cpu"], 2)
            row[f"{m}_wall_x"] = round(got[m]["wall"] / got["plain"]["wall"], 2)
            row[f"{m}_mem_x"] = round(got[m]["peak_kib"] / got["plain"]["peak_kib"], 2)
        rows.append(row)
        print(f"snapshot {row['snapshot']:20s} safe/plain CPU {row['safe_cpu_x']:.2f}x wall {row['safe_wall_x']:.2f}x "
              f"memory {row['safe_mem_x']:.2f}x; scan+load/plain CPU {row['scan_cpu_x']:.2f}x (load {load:.1f})",
              flush=True)
        path.unlink()
    return rows


ONE = "one process (ALLOCTUNE_WORKERS=1)"


def startup_seconds(forms: list[str], tmp: Path) -> float:
    """Wall seconds of `alloctune diagnose --json` on a log of one message (best of 3): the start-up
    every row pays once (interpreter, imports), which the `beyond start-up` rate leaves out."""
    path = tmp / "one.txt"
    path.write_text("[rank0] step 1: torch.OutOfMemoryError: " + forms[0] + "\n", encoding="utf-8")
    best = min(run(["diagnose", str(path), "--json"])[0] for _ in range(3))
    path.unlink()
    return best


def log_rows(sizes: list[int], mixed_mb: int, workers: int | None, tmp: Path) -> list[dict]:
    """The CLI on each log as a user runs it (terminal and --json; `workers`: ALLOCTUNE_WORKERS,
    None for the default), and in one process; the largest also from stdin."""
    forms = message_forms()
    startup = startup_seconds(forms, tmp)
    print(f"start-up (one message, --json): {startup:.3f} s", flush=True)
    rows = []
    logs = [(f"{s} MB, OOM only", s, False) for s in sizes]
    if mixed_mb:
        logs.append((f"{mixed_mb} MB, mixed", mixed_mb, True))
    for name, size, mixed in logs:
        path = tmp / f"log{size}{'m' if mixed else ''}.txt"
        count = write_log(path, size * MB, forms, mixed=mixed, seed=size)
        nbytes = path.stat().st_size
        modes = [("terminal (to a file)", [str(path)], None, False, workers),
                 ("--json", [str(path), "--json"], None, True, workers),
                 (f"terminal, {ONE}", [str(path)], None, False, 1),
                 (f"--json, {ONE}", [str(path), "--json"], None, True, 1)]
        if sizes and size == max(sizes) and not mixed:
            modes.append(("--json from stdin", ["-", "--json"], path, True, workers))
        for mode, cli, stdin, json_out, nproc in modes:
            load = os.getloadavg()[0]
            wall, rss, stdout = run(["diagnose", *cli], stdin, nproc)
            found = messages_in(stdout, json_out)
            rows.append({"log": name, "bytes": nbytes, "messages": count, "found": found, "mode": mode,
                         "seconds": round(wall, 3), "mb_per_s": round(nbytes / MB / wall, 2),
                         "startup_s": round(startup, 3),
                         "mb_per_s_beyond_startup": round(nbytes / MB / max(wall - startup, 1e-3), 2),
                         "peak_rss_mb": round(rss / MB, 1), "output_bytes": len(stdout), "load_avg": round(load, 2)})
            print(f"{name:18s} {mode:22s} {wall:7.2f} s {nbytes / MB / wall:6.2f} MB/s "
                  f"peak {rss / MB:6.1f} MB  output {len(stdout):,} B  messages {found}/{count}  load {load:.1f}",
                  flush=True)
        path.unlink()
    return rows


def linearity(rows: list[dict]) -> dict[str, float]:
    """(time at the largest size / time at the smallest) / size ratio, per mode: 1.0 is linear."""
    only = [r for r in rows if r["log"].endswith("OOM only")]
    lin = {}
    for mode in ("terminal (to a file)", "--json", f"terminal, {ONE}", f"--json, {ONE}"):
        pts = sorted((r["bytes"], r["seconds"]) for r in only if r["mode"] == mode)
        if len(pts) >= 2:
            (b0, t0), (b1, t1) = pts[0], pts[-1]
            lin[mode] = round((t1 / t0) / (b1 / b0), 2)
    return lin


def table(rows: list[dict], snaps: list[dict], lin: dict[str, float], load0: float, load1: float) -> str:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [f"Python {platform.python_version()}, {cpus} CPUs shared with other work; load average "
             f"{load0:.1f} at the start, {load1:.1f} at the end (each row gives the load when it started: "
             "with a load above 1 the figures are lower bounds). Each run is the CLI in a fresh process "
             "(start-up included), as a user runs it (ALLOCTUNE_WORKERS unset: this process and one per idle CPU for a log "
             "longer than its first chunk) and in one process (ALLOCTUNE_WORKERS=1); MB/s = log bytes / wall seconds; "
             "peak = the largest resident set of the CLI process and the workers it waited for; beyond start-up "
             "= log bytes / (wall seconds - the start-up, the same CLI on a log of one message"
             + (f", {rows[0]['startup_s']:.2f} s" if rows else "") + "). Linearity = "
             "(time at the largest size / time at the smallest) / size ratio: 1.0 is linear.", "",
             "| log | mode | messages found / written | seconds | MB/s | MB/s beyond start-up | peak memory | output "
             "| load |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['log']} | {r['mode']} | {r['found']:,} / {r['messages']:,} | {r['seconds']:.2f} | "
                     f"{r['mb_per_s']:.2f} | {r['mb_per_s_beyond_startup']:.2f} | {r['peak_rss_mb']:.0f} MB | "
                     f"{r['output_bytes']:,} B | {r['load_avg']:.1f} |")
    if lin:
        lines += ["", "Linearity: " + ", ".join(f"{m} {v}" for m, v in lin.items())]
    if snaps:
        lines += ["", "Snapshot first load, ratios to a plain `pickle.load` of the same file (best of the fresh "
                  "processes; CPU and wall seconds, peak memory the load added). `safe`: what alloctune runs "
                  "(screen + C load + limits check); `scan + load`: the opcode walk then the C load; `no check`: "
                  "the restricted unpickler alone.", "",
                  "| snapshot | plain: CPU s, peak | safe ÷ plain: CPU, wall, memory | scan + load ÷ plain: CPU, wall "
                  "| no check ÷ plain: CPU | load |", "|---|---|---|---|---|---|"]
        for r in snaps:
            lines.append(f"| {r['snapshot']} | {r['plain']['cpu']:.2f} s, {r['plain']['peak_kib'] / 1024:.0f} MiB | "
                         f"**{r['safe_cpu_x']:.2f}x**, {r['safe_wall_x']:.2f}x, {r['safe_mem_x']:.2f}x | "
                         f"{r['scan_cpu_x']:.2f}x, {r['scan_wall_x']:.2f}x | {r['nocheck_cpu_x']:.2f}x | "
                         f"{r['load_avg']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10,40,80", help="log sizes in MB (OOM messages only; empty: none)")
    ap.add_argument("--mixed", type=int, default=40, help="size of the mixed log in MB (0: none)")
    ap.add_argument("--workers", type=int, default=None,
                    help="ALLOCTUNE_WORKERS for the rows as a user runs them (default: unset, alloctune's default)")
    ap.add_argument("--snapshot-mb", type=int, default=70, help="size of the generated snapshots (0: none)")
    ap.add_argument("--reps", type=int, default=3, help="fresh processes per snapshot load method (best kept)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "diagnose_speed.md"))
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        rows = log_rows(sizes, args.mixed, args.workers, Path(tmp)) if sizes or args.mixed else []
        snaps = snapshot_rows(args.snapshot_mb, args.reps, Path(tmp)) if args.snapshot_mb else []
    load1 = os.getloadavg()[0]
    lin = linearity(rows)
    ok = all(r["found"] == r["messages"] for r in rows)
    sys.path.insert(0, str(ROOT / "bench"))
    import results
    import runlog

    command = runlog.command(argv if argv is None else [sys.argv[0], *argv])
    body = table(rows, snaps, lin, load0, load1)
    print(body)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runlog.append_section(out, "diagnose speed: logs of distinct OOM messages, snapshot first loads", f"`{command}`",
                          body)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out.with_suffix(".json").write_text(json.dumps({"schema": SCHEMA, "command": command, "generated": stamp,
                                                    "rows": rows, "linearity": lin, "snapshots": snaps,
                                                    "load_avg": [load0, load1], "counts_match": ok}, indent=1))
    for r in rows:
        if r["mode"] in ("terminal (to a file)", "--json", f"terminal, {ONE}", f"--json, {ONE}"):
            runlog.log_result(f"{r['log']}, {r['mode']}: {r['mb_per_s']:.2f} MB/s "
                              f"({r['mb_per_s_beyond_startup']:.2f} beyond the {r['startup_s']:.2f} s start-up), "
                              f"peak {r['peak_rss_mb']:.0f} MB, "
                              f"output {r['output_bytes']:,} B (load {r['load_avg']:.1f})", folder=out.parent)
    if lin:
        runlog.log_result("linearity 10->80 MB: " + ", ".join(f"{m} {v}" for m, v in lin.items()), folder=out.parent)
    for r in snaps:
        runlog.log_result(f"snapshot {r['snapshot']}: safe load {r['safe_cpu_x']:.2f}x CPU, {r['safe_wall_x']:.2f}x "
                          f"wall, {r['safe_mem_x']:.2f}x memory of plain pickle.load; scan + load {r['scan_cpu_x']:.2f}x "
                          f"CPU (load {r['load_avg']:.1f})", folder=out.parent)
    results.main(["--dir", str(out.parent)])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
