"""Run every reference workload under a few allocator settings; record one trace each.

Each (workload, setting) is a fresh process (`python -m alloctune.workloads.NAME`) with
`PYTORCH_CUDA_ALLOC_CONF` set; the workload's own JSON summary gives peak allocated, peak
reserved, utilization (= peak allocated / peak reserved) and wall time. The run under the
default setting goes through `alloctune record` and leaves `NAME.pickle.xz` in --out.

    python bench/record_workloads.py --out /tmp/wl                   # GPU, full size
    python bench/record_workloads.py --out /tmp/wl --tiny --device cpu --no-record   # CPU check

Writes `workloads_results.json` and `workloads_results.md` (a dated section for
bench/RESULTS.md) into --out, prints a table, and appends the section to --append-results
when given.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
CONFS: dict[str, str] = {
    "default": "",
    "expandable": "expandable_segments:True",
    "max_split_128": "max_split_size_mb:128",
}
# Full-size item counts chosen so one run takes well under a minute on an H200 and the
# xz traces stay around a megabyte each (a few hundred thousand allocator events).
COUNTS: dict[str, int] = {"rvc": 6, "diffusion": 6, "llm": 6, "train": 40}
WORKLOADS = tuple(COUNTS)


def workload_command(name: str, args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, "-m", f"alloctune.workloads.{name}", "--device", args.device,
           "--seed", str(args.seed), "--quiet"]
    if args.tiny:
        cmd.append("--tiny")
    else:
        cmd += ["--count", str(args.count or COUNTS[name])]
    return cmd


def child_env(conf: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTORCH_ALLOC_CONF", None)  # the newer name would override ours
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    else:
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    src = str(REPO / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def parse_output(stdout: str) -> tuple[dict | None, dict | None]:
    """The workload's one-line summary and, when recorded, `alloctune record --json`'s result."""
    lines = stdout.splitlines()
    summary, record = None, None
    for i, line in enumerate(lines):
        if line.startswith('{"workload"'):
            summary = json.loads(line)
            rest = "\n".join(lines[i + 1 :]).strip()
            if rest.startswith("{"):
                record = json.loads(rest)
    return summary, record


def run_one(name: str, conf_name: str, args: argparse.Namespace, out: Path) -> dict:
    cmd = workload_command(name, args)
    if args.record_all:  # every setting, laid out as bench/fidelity.py reads it: traces/NAME/CONF.pickle.xz
        trace = out / "traces" / name / f"{conf_name}.pickle.xz"
        trace.parent.mkdir(parents=True, exist_ok=True)
    else:
        trace = out / f"{name}.pickle.xz"
    recorded = (conf_name == "default" or args.record_all) and not args.no_record
    if recorded:
        cmd = [sys.executable, "-m", "alloctune", "record", "--out", str(trace), "--json", "--"] + cmd
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(CONFS[conf_name]),
                              timeout=args.timeout, cwd=REPO)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stdout, stderr = 124, (exc.stdout or b"").decode(errors="replace"), "timeout"
    process_s = time.perf_counter() - t0
    summary, record = parse_output(stdout)
    row = {
        "workload": name, "conf": conf_name, "conf_string": CONFS[conf_name], "rc": rc,
        "process_s": round(process_s, 2), "recorded": recorded,
        "trace": str(trace) if recorded and trace.exists() else None,
        "trace_bytes": trace.stat().st_size if recorded and trace.exists() else None,
        "summary": summary, "record": record,
    }
    if summary is None or rc not in (0,):
        row["stderr_tail"] = stderr[-1500:]
    return row


def fmt_bytes(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def render(rows: list[dict], console: Console) -> None:
    table = Table(title="reference workloads under three allocator settings")
    for col in ("workload", "setting", "outcome", "items", "items/s", "peak alloc", "peak reserved",
                "utilization", "retries", "wall s", "trace"):
        table.add_column(col, justify="right" if col not in ("workload", "setting", "outcome") else "left")
    for row in rows:
        s = row["summary"] or {}
        util = s.get("utilization")
        table.add_row(
            row["workload"], row["conf"], s.get("outcome", row.get("skipped") or f"rc {row['rc']}"),
            str(s.get("items", "-")),
            f"{s['items_per_s']:.3f}" if s else "-", fmt_bytes(s.get("peak_allocated")),
            fmt_bytes(s.get("peak_reserved")), f"{util:.3f}" if util else "-",
            str(s.get("num_alloc_retries") if s.get("num_alloc_retries") is not None else "-"),
            f"{s['wall_s']:.1f}" if s else "-",
            f"{row['trace_bytes'] / 2**20:.2f} MiB" if row["trace_bytes"] else "-",
        )
    console.print(table)


def markdown(rows: list[dict], args: argparse.Namespace, started: str) -> str:
    head = (f"\n## {started} — reference workloads (`bench/record_workloads.py`)\n\n"
            f"Command: `python bench/record_workloads.py {' '.join(args.argv)}`; "
            f"device {rows[0]['summary'].get('device') if rows and rows[0]['summary'] else '?'}, "
            f"torch {rows[0]['summary'].get('torch') if rows and rows[0]['summary'] else '?'}"
            f"{f'; {args.jobs} runs side by side (peaks are per process; items/s is shared)' if args.jobs > 1 else ''}.\n\n"
            "| workload | setting | outcome | items | items/s | peak allocated | peak reserved | utilization | "
            "retries | wall s | trace |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = []
    for row in rows:
        s = row["summary"] or {}
        util = s.get("utilization")
        body.append(
            f"| {row['workload']} | {row['conf']} | {s.get('outcome', row.get('skipped') or 'rc ' + str(row['rc']))} | "
            f"{s.get('items', '-')} | {s.get('items_per_s', '-')} | {s.get('peak_allocated', '-')} | "
            f"{s.get('peak_reserved', '-')} | {f'{util:.4f}' if util else '-'} | "
            f"{s.get('num_alloc_retries', '-')} | {s.get('wall_s', '-')} | "
            f"{row['trace_bytes'] if row['trace_bytes'] else '-'} |"
        )
    return head + "\n".join(body) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for traces and results")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list (default all four)")
    parser.add_argument("--confs", default=",".join(CONFS), help=f"comma list of {', '.join(CONFS)}")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny models (CPU check of the script)")
    parser.add_argument("--count", type=int, default=None, help="items per run (default per workload)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-record", action="store_true", help="do not record traces (no CUDA needed)")
    parser.add_argument("--record-all", action="store_true",
                        help="record every setting's run (for the simulator's fidelity check), not only the default")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per run")
    parser.add_argument("--deadline-s", type=float, default=0.0, help="skip runs that would start after this")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs side by side (separate processes; peaks are per process, items/s is shared)")
    parser.add_argument("--append-results", type=Path, default=None, help="append the section to this file")
    args = parser.parse_args(argv)
    args.argv = argv if argv is not None else sys.argv[1:]
    names = [n for n in args.workloads.split(",") if n]
    confs = [c for c in args.confs.split(",") if c]
    unknown = [n for n in names if n not in COUNTS] + [c for c in confs if c not in CONFS]
    if unknown:
        parser.error(f"unknown workload or setting: {', '.join(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console(highlight=False, width=150)
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.perf_counter()
    # Setting-major order: every workload's default (recorded) run comes first, so a deadline
    # that cuts the batch short costs comparisons, not traces.
    order = [(name, conf) for conf in confs for name in names]

    def task(name: str, conf: str) -> dict:
        if args.deadline_s and time.perf_counter() - t0 > args.deadline_s:
            console.print(f"skipped {name}/{conf}: past the {args.deadline_s:.0f} s deadline")
            return {"workload": name, "conf": conf, "conf_string": CONFS[conf], "rc": None,
                    "skipped": "deadline", "summary": None, "record": None, "trace_bytes": None}
        row = run_one(name, conf, args, args.out)
        s = row["summary"] or {}
        console.print(f"{name:9s} {conf:13s} rc={row['rc']} items={s.get('items', '-')} "
                      f"util={s.get('utilization', '-')} process {row['process_s']:.1f} s", highlight=False)
        if "stderr_tail" in row:
            console.print(row["stderr_tail"][-600:], markup=False)
        return row

    # --jobs > 1 runs separate processes side by side on one GPU: each process has its own caching
    # allocator, so its allocation sequence and peaks are unchanged; only throughput is shared.
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(lambda nc: task(*nc), order))
    rows.sort(key=lambda r: (names.index(r["workload"]), confs.index(r["conf"])))
    (args.out / "workloads_results.json").write_text(json.dumps({"schema": 1, "started": started, "rows": rows},
                                                                 indent=2))
    section = markdown(rows, args, started)
    (args.out / "workloads_results.md").write_text(section)
    if args.append_results:
        with args.append_results.open("a") as f:
            f.write(section)
    render(rows, console)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runlog import log_result

    for r in rows:
        s = r["summary"] or {}
        log_result(f"{r['workload']} {r['conf']}: rc={r['rc']} {'skipped: ' + r['skipped'] if r.get('skipped') else ''} "
                   f"peak reserved {s.get('peak_reserved', '-')} B, utilization {s.get('utilization', '-')}",
                   folder=args.out)
    failed = [r for r in rows if not r.get("skipped") and (r["rc"] != 0 or r["summary"] is None)]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
