# `alloctune watch` beside `alloctune run` (live numbers = the agent's final report), a fragmentation OOM snapshot
# explained by `diagnose --snapshot` and `report`, the recommended setting run for real (~1 min)
# limit: 180 s
set -uo pipefail
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$(mktemp -d)}"
WORK="$(mktemp -d)"
export ALLOCTUNE_STATE_DIR="$WORK/live"
mkdir -p "$OUT" "$WORK/live" "$WORK/oom"
PY="${PYTHON:-python3}"
AT=("$PY" -m alloctune)

cat > "$WORK/frag.py" <<'EOF'
"""Pins 14 segments with one small live block each, then (phase oom) asks for more than fits."""
import sys, time
import torch

MiB = 1 << 20
phase = sys.argv[1]
dev = torch.device("cuda")
keep, hole = [], []
for i in range(14):
    big = torch.empty(64 * MiB, dtype=torch.uint8, device=dev)       # a fresh 64 MiB segment
    del big                                                            # cached, whole
    keep.append(torch.empty(24 * MiB, dtype=torch.uint8, device=dev))  # carved from its start
    hole.append(torch.empty(40 * MiB, dtype=torch.uint8, device=dev))  # takes the exact 40 MiB rest
    time.sleep(0.1)
del hole  # 14 segments: 24 MiB live + 40 MiB free each (896 MiB reserved, 336 MiB allocated)
s = torch.cuda.memory_stats()
print(f"pinned: reserved {s['reserved_bytes.all.current']} allocated {s['allocated_bytes.all.current']}", flush=True)
if phase == "oom":
    x = torch.empty(200 * MiB, dtype=torch.uint8, device=dev)     # 896 MiB reserved + 200 MiB > 1 GiB budget
    print("the 200 MiB request fit", flush=True)
else:
    y = torch.empty(100 * MiB, dtype=torch.uint8, device=dev)     # fits: one more segment
    del y
    time.sleep(3.0)  # let watch see the final peaks (the agent samples every second)
print("throughput: 1 items/s", flush=True)
EOF

echo "== 1. watch beside alloctune run"
"${AT[@]}" watch --interval 0.5 --json > "$OUT/watch.jsonl" 2> "$WORK/watch.err" &
WATCH_PID=$!
sleep 2
"${AT[@]}" run --budget 1GiB --json -- "$PY" "$WORK/frag.py" hold > "$OUT/run.json" 2> "$WORK/run.err"
echo "run exit code: $?"; tail -3 "$WORK/run.err"
sleep 1
kill "$WATCH_PID" 2>/dev/null; wait "$WATCH_PID" 2>/dev/null
head -c 600 "$WORK/watch.err"

echo "== 2. OOM under --on-oom snapshot"
( cd "$WORK/oom" && "${AT[@]}" run --budget 1GiB --on-oom snapshot --json -- "$PY" "$WORK/frag.py" oom \
    > "$OUT/oom_run.json" 2> "$WORK/oom_run.err" )
echo "oom run exit code: $? (1 expected: the program died of the OOM)"
SNAP="$(ls "$WORK"/oom/oom-snapshot.*.pickle 2>/dev/null | head -1)"
if [ -n "$SNAP" ]; then
    cp "$SNAP" "$OUT/oom-snapshot.pickle"
    "${AT[@]}" diagnose --snapshot "$SNAP" --budget 1GiB --json > "$OUT/diagnosis.json" 2> "$WORK/diag.err"
    echo "diagnose --snapshot exit code: $?"; head -c 400 "$WORK/diag.err"
    "${AT[@]}" diagnose --snapshot "$SNAP" --budget 1GiB | tee "$WORK/diag.txt" | head -40
    "${AT[@]}" report "$SNAP" --out "$WORK/report" --title "alloctune GPU OOM snapshot" > /dev/null 2> "$WORK/report.err"
    echo "report exit code: $?"; head -c 400 "$WORK/report.err"
    [ -f "$WORK/report/report.html" ] && cp "$WORK/report/report.html" "$OUT/report.html"
    FIX="$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1])).get('recommendation') or '')" "$OUT/diagnosis.json" 2>/dev/null)"
    if [ -n "$FIX" ]; then
        echo "== 3. the recommended setting, for real: $FIX"
        ( cd "$WORK/oom" && "${AT[@]}" run --budget 1GiB --conf "$FIX" --json -- "$PY" "$WORK/frag.py" oom \
            > "$OUT/fix_run.json" 2> "$WORK/fix_run.err" )
        echo "fixed run exit code: $?"; grep -m1 "request fit" "$WORK/fix_run.err"
    fi
else
    echo "no oom-snapshot.*.pickle was written; stderr of the run:"; tail -20 "$WORK/oom_run.err"
fi

echo "== summary"
"$PY" - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows, ok = [], True

def check(name, cond, detail=""):
    global ok
    ok &= bool(cond)
    rows.append((name, "PASS" if cond else "FAIL", detail))

try:
    run = json.loads((out / "run.json").read_text())
except Exception as exc:
    run = {}
    check("alloctune run --json", False, repr(exc))
final = run.get("stats") or {}
check("run outcome ok", run.get("outcome") == "ok", f"outcome={run.get('outcome')} error={run.get('error')}")
seen = []
for line in (out / "watch.jsonl").read_text().splitlines() if (out / "watch.jsonl").exists() else []:
    s = json.loads(line)
    for g in s["gpus"]:
        for p in g["processes"]:
            a = p.get("allocator")
            if a and "frag.py" in a.get("cmd", ""):
                seen.append((s["time"], g, p, a))
check("watch saw the run's live stats", bool(seen), f"{len(seen)} samples")
if seen:
    _, g, p, a = seen[-1]
    st = a["stats"]
    for key in ("reserved_bytes.all.peak", "allocated_bytes.all.peak", "segment.all.peak", "num_alloc_retries",
                "num_ooms", "inactive_split_bytes.all.peak"):
        check(f"watch == final report: {key}", st.get(key) == final.get(key), f"{st.get(key)} vs {final.get(key)}")
    used = p.get("used")
    check("NVML used >= reserved (context included)", used is None or used >= st.get("reserved_bytes.all.current", 0),
          f"nvml {used} vs reserved {st.get('reserved_bytes.all.current')}; pid seen by NVML: {used is not None}")
try:
    oom = json.loads((out / "oom_run.json").read_text())
except Exception:
    oom = {}
check("oom run outcome oom", oom.get("outcome") == "oom", f"outcome={oom.get('outcome')}")
check("oom snapshot written", (out / "oom-snapshot.pickle").exists(), str(oom.get("oom_snapshot")))
try:
    d = json.loads((out / "diagnosis.json").read_text())
except Exception:
    d = {}
MiB = 1 << 20
check("diagnosis: state read at the OOM", d.get("state_source") == "snapshot-at-oom", str(d.get("state_source")))
check("diagnosis: fragmentation", d.get("verdict") == "fragmentation", str(d.get("summary")))
check("diagnosis: largest free block 40 MiB < 200 MiB", d.get("largest_free") == 40 * MiB and d.get("request") == 200 * MiB,
      f"largest_free={d.get('largest_free')} request={d.get('request')}")
check("diagnosis: 14 pinned segments", d.get("pinned_count") == 14, f"pinned={d.get('pinned_count')} free={d.get('pinned_free')}")
w = {x["config"]: x for x in d.get("what_if", [])}
check("what-if: recorded setting reproduces the OOM", (w.get("") or {}).get("avoids_oom") is False, str(w.get("")))
check("what-if: a setting serves the request", d.get("recommendation") is not None, str(d.get("recommendation")))
try:
    fix = json.loads((out / "fix_run.json").read_text())
except Exception:
    fix = {}
check("recommended setting, run for real: ok", fix.get("outcome") == "ok",
      f"conf={fix.get('conf')} outcome={fix.get('outcome')} peak_reserved={fix.get('peak_reserved')}")
html = (out / "report.html").read_text() if (out / "report.html").exists() else ""
import re
remote = re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, re.I)
check("report.html self-contained", bool(html) and not remote and "<script" not in html
      and 'src="data:image/png;base64,' in html, f"{len(html)} chars, {len(remote)} remote refs")
print("| check | result | detail |\n|---|---|---|")
for r in rows:
    print("| " + " | ".join(str(c).replace("|", "/") for c in r) + " |")
print("ALL PASS" if ok else "SOME CHECKS FAILED")
EOF
rm -rf "$WORK"
echo "results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
