"""First load of a large memory snapshot: plain `pickle.load` against alloctune's safe loads (issue #30, item 5).

Builds two ~70 MB uncompressed snapshot pickles from real recordings (written here with plain
pickle, our own data): `events` concatenates the `device_traces` of the shared traces (no stacks,
like the 644k-request llm recording), `stacks` repeats the events of the batch-8 recordings made
with Python stacks (each copy keeps sharing its frame lists, as torch's snapshots do). Then, each
in a fresh process (best of --reps; wall and CPU seconds, and the peak resident memory the load
added over the process before it):

- `pickle.load`: the plain, unsafe load of the same file (the yardstick);
- `safe load`: `load_pickle_file` as alloctune runs it now (screen + C load + limits check);
- `scan + load`: the previous safe load (the Python opcode walk `scan`, then the C load);
- `no check`: the restricted unpickler alone (globals refused, no limits: what safety costs).

The original shared `.pickle.xz` files are timed too (there the yardstick is `lzma` + `pickle.loads`).
Writes bench/results/snapshot_load.md and rebuilds bench/results/RESULTS.md (bench/results.py).

    python bench/snapshot_load.py [--reps 3] [--size 70MB] [--no-results]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pickle
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from suite import ROOT, SHARED

STACKS = ROOT / "tests" / "data" / "explain_gpu"  # real H200 recordings with Python stacks
MB = 1_000_000

# Run in a fresh interpreter: argv = method, path. Prints one JSON line.
CHILD = r"""
import json, lzma, pickle, resource, sys, time
sys.path.insert(0, sys.argv[3])
from alloctune.trace.safe_pickle import RestrictedUnpickler, load_pickle_file, read_decompressed, scanned_loads
import io
method, path = sys.argv[1], sys.argv[2]
def hwm_kib():  # VmHWM: this process's own peak (ru_maxrss would carry the parent's over exec on Linux)
    try:
        with open("/proc/self/status") as f:
            return int(next(ln for ln in f if ln.startswith("VmHWM:")).split()[1])
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
def plain():
    if path.endswith(".xz"):
        with open(path, "rb") as f:
            return pickle.loads(lzma.decompress(f.read()))
    with open(path, "rb") as f:
        return pickle.load(f)
def no_check():
    if path.endswith(".xz"):
        return RestrictedUnpickler(io.BytesIO(read_decompressed(path))).load()
    with open(path, "rb") as f:
        return RestrictedUnpickler(f).load()
fn = {"plain": plain, "safe": lambda: load_pickle_file(path),
      "scan": lambda: scanned_loads(read_decompressed(path)), "nocheck": no_check}[method]
base = hwm_kib()
w, c = time.perf_counter(), time.process_time()
value = fn()
w, c = time.perf_counter() - w, time.process_time() - c
peak = hwm_kib()
n = len(value["device_traces"][0])
print(json.dumps({"wall": w, "cpu": c, "peak_kib": peak - base, "events": n}))
"""

METHODS = [("plain", "pickle.load"), ("safe", "safe load"), ("scan", "scan + load"), ("nocheck", "no check")]


def build_events(path: Path, size: int) -> None:
    """Concatenate the shared recordings' device_traces (default runs first) until the pickle is `size` bytes."""
    files = sorted(SHARED.glob("*/*.pickle.xz"), key=lambda p: (p.stem != "default.pickle", str(p)))
    _build(path, size, files, copy_events=False)


def build_stacks(path: Path, size: int) -> None:
    """Repeat the events of the recordings with Python stacks (frame lists stay shared) up to `size` bytes."""
    files = sorted(p for p in STACKS.glob("*.pickle.xz") if "cpp" not in p.name)
    _build(path, size, files, copy_events=True)


def _build(path: Path, size: int, files: list[Path], copy_events: bool) -> None:
    from alloctune.trace.safe_pickle import load_pickle_file

    snaps = []
    for f in files:
        snap = load_pickle_file(f)
        if any("frames" in e for e in snap["device_traces"][0][:50]) == copy_events:
            snaps.append(snap)
    first = snaps[0]
    sample = [e for s in snaps for e in s["device_traces"][0][:2000]]
    per_event = len(pickle.dumps(sample if not copy_events else [dict(e) for e in sample])) / len(sample)
    want = int((size - len(pickle.dumps(first["segments"]))) / per_event)
    events: list = []
    while len(events) < want:
        for s in snaps:
            evs = s["device_traces"][0]
            take = evs[: want - len(events)]
            if copy_events:
                events.extend(dict(e) for e in take)  # a new event dict; its frame list stays shared
            else:
                events.extend(take)
            if len(events) >= want:
                break
    out = {"segments": first["segments"], "device_traces": [events],
           "allocator_settings": first.get("allocator_settings", {}), "external_annotations": []}
    with open(path, "wb") as f:
        pickle.dump(out, f, protocol=4)  # what torch's _dump_snapshot writes (pickle's default since 3.8)


def run_child(method: str, path: Path) -> dict:
    res = subprocess.run([sys.executable, "-c", CHILD, method, str(path), str(ROOT / "src")],
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def measure_all(path: Path, reps: int) -> dict[str, dict]:
    """Best of `reps` per method and figure, the methods taking turns (so a busy spell hits them alike)."""
    best: dict[str, dict] = {}
    for _ in range(reps):
        for method, _label in METHODS:
            row = run_child(method, path)
            old = best.get(method)
            best[method] = row if old is None else {k: min(old[k], row[k]) if k != "events" else row[k]
                                                    for k in row}
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--size", default="70MB", help="size of the generated pickles (MB = 10**6 bytes)")
    ap.add_argument("--no-results", action="store_true", help="only print the table")
    args = ap.parse_args()
    size = int(float(args.size.upper().removesuffix("MB")) * MB)
    cmd = "python bench/snapshot_load.py" + (f" --reps {args.reps}" if args.reps != 3 else "") + (
        f" --size {args.size}" if args.size != "70MB" else "")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        inputs: list[tuple[str, Path]] = []
        for name, build in (("events", build_events), ("stacks", build_stacks)):
            p = Path(tmp) / f"{name}.pickle"
            build(p, size)
            inputs.append((f"generated: {name} ({p.stat().st_size / MB:.1f} MB)", p))
        for rel in ("llm/default.pickle.xz", "rvc_ec1/default.pickle.xz"):
            if (SHARED / rel).is_file():
                inputs.append((f"original: {rel}", SHARED / rel))
        for label, path in inputs:
            got = measure_all(path, args.reps)
            rows.append((label, got))
            print(label, json.dumps(got), flush=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    def ratio(got: dict, method: str, key: str) -> float:
        return got[method][key] / got["plain"][key]

    head = rows[0][1]
    lines = [
        f"## Snapshot load: alloctune's safe load takes {ratio(head, 'safe', 'cpu'):.2f}x the CPU time "
        f"({ratio(head, 'safe', 'wall'):.2f}x the wall time) and {ratio(head, 'safe', 'peak_kib'):.2f}x the peak "
        f"memory of plain pickle.load on a {rows[0][0].split('(')[-1].rstrip(')')} snapshot (`{cmd}`, {stamp})",
        "",
        f"`{cmd}` on {platform.machine()} ({os.cpu_count()} cores, shared with other jobs: wall times vary, "
        f"CPU times less), Python {platform.python_version()}. Each cell: best of {args.reps} fresh processes "
        "(the methods take turns); "
        "wall / CPU seconds, then the peak resident memory the load added (VmHWM). Ratios are to plain "
        "`pickle.load` of the same file (for .xz: `lzma` + `pickle.loads`). `safe load`: screen + C load + "
        "limits check (what alloctune runs now); `scan + load`: the opcode walk, then the C load (what it ran "
        "before); `no check`: the restricted unpickler alone, no limits.",
        "",
        "| file | events | " + " | ".join(t for _, t in METHODS)
        + " | safe ÷ plain: CPU, wall, memory | scan + load ÷ plain: CPU |",
        "|---|---|" + "---|" * len(METHODS) + "---|---|",
    ]
    for label, got in rows:
        cells = [f"{got[m]['wall']:.2f} / {got[m]['cpu']:.2f} s, {got[m]['peak_kib'] / 1024:.0f} MiB"
                 for m, _ in METHODS]
        lines.append(f"| {label} | {got['plain']['events']} | " + " | ".join(cells)
                     + f" | **{ratio(got, 'safe', 'cpu'):.2f}x**, {ratio(got, 'safe', 'wall'):.2f}x, "
                     f"{ratio(got, 'safe', 'peak_kib'):.2f}x | {ratio(got, 'scan', 'cpu'):.2f}x |")
    print()
    print("\n".join(lines))
    if not args.no_results:
        (ROOT / "bench" / "results" / "snapshot_load.md").write_text("\n".join(lines) + "\n")
        import results  # bench/results.py: rebuilds the index that lists this table with its command

        results.main(["--dir", str(ROOT / "bench" / "results")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
