"""How fast `alloctune diagnose` reads a log of many OOM messages: MB/s, linearity, peak memory.

Generates logs of *distinct* OOM messages (the real message forms of
/work/shared/oom-messages/corpus.jsonl with every size and device number varied, each line
prefixed `[rankN] step K:` as a multi-rank job prints them) at 10, 40 and 80 MB, and a mixed
log (OOM messages among ordinary training-log lines). Each log is diagnosed by the real CLI in a
fresh process: the terminal rendering written to a file, and `--json`; the 80 MB log once more
through stdin. The count of messages the CLI reports is checked against the count generated
(an independent fact: the generator knows how many it wrote). Peak memory is the child's
maximum resident set size.

    python bench/diagnose_speed.py [--sizes 10,40,80] [--out bench/results/diagnose_speed.md]

Writes the table to --out and its rows to the .json beside it, then rebuilds
bench/results/RESULTS.md (bench/results.py), which lists the headline figures with this command.
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


def run(args: list[str], stdin_path: Path | None = None, workers: int = 1) -> tuple[float, int, bytes]:
    """Wall seconds, peak RSS (bytes; the largest process's, workers included) and stdout of
    `alloctune ARGS` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "120", "ALLOCTUNE_WORKERS": str(workers)}
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10,40,80", help="log sizes in MB (OOM messages only)")
    ap.add_argument("--mixed", type=int, default=40, help="size of the mixed log in MB (0: none)")
    ap.add_argument("--workers", type=int, default=2, help="processes for the ALLOCTUNE_WORKERS row")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "diagnose_speed.md"))
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    load0 = os.getloadavg()[0]
    forms = message_forms()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        logs = [(f"{s} MB, OOM only", s, False) for s in sizes]
        if args.mixed:
            logs.append((f"{args.mixed} MB, mixed", args.mixed, True))
        for name, size, mixed in logs:
            path = Path(tmp) / f"log{size}{'m' if mixed else ''}.txt"
            count = write_log(path, size * MB, forms, mixed=mixed, seed=size)
            nbytes = path.stat().st_size
            modes = [("terminal (to a file)", [str(path)], None, False, 1),
                     ("--json", [str(path), "--json"], None, True, 1)]
            if size == max(sizes) and not mixed:
                modes.append(("--json from stdin", ["-", "--json"], path, True, 1))
                modes.append((f"--json, ALLOCTUNE_WORKERS={args.workers}", [str(path), "--json"], None, True,
                              args.workers))
            for mode, cli, stdin, json_out, nproc in modes:
                wall, rss, stdout = run(["diagnose", *cli], stdin, nproc)
                found = messages_in(stdout, json_out)
                rows.append({"log": name, "bytes": nbytes, "messages": count, "found": found, "mode": mode,
                             "seconds": round(wall, 3), "mb_per_s": round(nbytes / MB / wall, 2),
                             "peak_rss_mb": round(rss / MB, 1), "output_bytes": len(stdout)})
                print(f"{name:18s} {mode:22s} {wall:7.2f} s {nbytes / MB / wall:6.2f} MB/s "
                      f"peak {rss / MB:6.1f} MB  output {len(stdout):,} B  messages {found}/{count}", flush=True)
    only = [r for r in rows if r["log"].endswith("OOM only")]
    lin = {}
    for mode in ("terminal (to a file)", "--json"):
        pts = sorted((r["bytes"], r["seconds"]) for r in only if r["mode"] == mode)
        if len(pts) >= 2:
            (b0, t0), (b1, t1) = pts[0], pts[-1]
            lin[mode] = round((t1 / t0) / (b1 / b0), 2)
    ok = all(r["found"] == r["messages"] for r in rows)
    command = "python bench/diagnose_speed.py" + (f" --sizes {args.sizes}" if args.sizes != "10,40,80" else "") + (
        f" --mixed {args.mixed}" if args.mixed != 40 else "") + (f" --workers {args.workers}" if args.workers != 2 else "")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [f"# diagnose speed on logs of distinct OOM messages ({stamp}, Python {platform.python_version()}, "
             f"{cpus} CPUs, shared machine)", "",
             f"Command: `{command}`. Each run is the CLI in a fresh process (start-up included); MB/s = log bytes / "
             "wall seconds; peak = the largest resident set of the CLI process and of the worker processes it "
             "waited for. Linearity = (time at the largest size / time at the smallest) / (size ratio): 1.0 is "
             f"linear. Load average at the start: {load0:.1f} on {cpus} CPUs (shared with other "
             "work: the figures are lower bounds).", "",
             "| log | mode | messages found / written | seconds | MB/s | peak memory | output |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['log']} | {r['mode']} | {r['found']:,} / {r['messages']:,} | {r['seconds']:.2f} | "
                     f"{r['mb_per_s']:.2f} | {r['peak_rss_mb']:.0f} MB | {r['output_bytes']:,} B |")
    lines += ["", "Linearity: " + ", ".join(f"{m} {v}" for m, v in lin.items()), ""]
    table = "\n".join(lines)
    print(table)
    out = Path(args.out)
    out.write_text(table, encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps({"schema": SCHEMA, "command": command, "generated": stamp,
                                                    "rows": rows, "linearity": lin, "counts_match": ok}, indent=1))
    sys.path.insert(0, str(ROOT / "bench"))
    import results

    results.main(["--dir", str(out.parent)])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
