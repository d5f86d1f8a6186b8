#!/usr/bin/env bash
# GPU evidence for alloctune.guard (run from the repo root on the H200; ~4-5 minutes).
#   (a) chunked RVC decoder on a 300 s clip under a 4 GiB budget vs the unchunked call,
#   (b) Janitor vs never / every-request empty_cache on 200 mixed-length requests, under the default
#       allocator and again (a fresh process, files in $OUT/expandable/) under expandable_segments:True,
#   (c) oom_retry overhead on a >= 5 ms GPU step,
#   plus tests/test_guard_gpu.py when pytest is installed.
# Files in $OUT: guard_gpu.json, guard_gpu.md, guard_overhead_gpu.json, guard_overhead_gpu.md, pytest_gpu.txt
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

timeout -k 5 200 python3 bench/guard_gpu.py --out "$OUT" --seconds 300 --budget 4GiB --requests 200 \
  --time-limit-b 120
echo "guard_gpu rc=$?"
mkdir -p "$OUT/expandable"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout -k 5 130 python3 bench/guard_gpu.py \
  --out "$OUT/expandable" --parts b --requests 200 --time-limit-b 100
echo "guard_gpu (expandable) rc=$?"

timeout -k 5 45 python3 bench/guard_overhead.py --device cuda --rounds 150 \
  --json "$OUT/guard_overhead_gpu.json" --results "$OUT/guard_overhead_gpu.md"
echo "guard_overhead rc=$?"

if python3 -c "import pytest" 2>/dev/null; then
  timeout -k 5 50 python3 -m pytest -q -p no:cacheprovider tests/test_guard_gpu.py > "$OUT/pytest_gpu.txt" 2>&1
  echo "pytest rc=$?"; tail -n 3 "$OUT/pytest_gpu.txt"
else
  echo "pytest not installed: skipped tests/test_guard_gpu.py"
fi

echo "================ summary ================"
python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
def load(path):
    try:
        return json.loads(path.read_text())
    except Exception as e:
        print("no", path, e); return {}
r = load(out / "guard_gpu.json")
a = r.get("a")
if a:
    c = a["chunked_first_call"]
    bud = f"{a['budget'] / 2**30:.2f} GiB" if isinstance(a["budget"], int) else a["budget"]
    print(f"(a) {a['seconds']:.0f}s clip, budget {bud}: plain={a['plain_under_budget']['outcome']} "
          f"chunked pieces={c['pieces']} halvings={c['halvings']} final={c['final_chunk']} frames "
          f"len_ok={c['same_length']} max_abs_diff={c['max_abs_diff']:.2e} -> {'PASS' if a['pass'] else 'FAIL'}")
for b in (r.get("b"), load(out / "expandable" / "guard_gpu.json").get("b")):
    if not b:
        continue
    print(f"(b) allocator {b.get('alloc_conf') or 'default'}")
    print(f"    {'order':17} {'policy':22} {'empties':>7} {'peak res MiB':>12} {'peak alloc MiB':>14} {'ratio':>6} {'vs every':>8}")
    for order, v in b["orders"].items():
        for x in v["runs"]:
            print(f"    {order:17} {x['policy']:22} {x['empty_cache_calls']:7d} {x.get('peak_reserved', 0) / 2**20:12.1f} "
                  f"{x.get('peak_allocated', 0) / 2**20:14.1f} {x.get('reserved_over_allocated', float('nan')):6.3f} "
                  f"{x.get('reserved_over_every', float('nan')):8.3f}")
    print("    verdicts (literal / floor):", {k: (v["literal"], v["floor"]) for k, v in b["verdicts"].items()})
try:
    o = json.loads((out / "guard_overhead_gpu.json").read_text())
    for row in o["rows"]:
        print(f"(c) {row['variant']:14} step {o['plain_median_ms']:.2f} ms, wrapper {row['wrapper_us']:.2f} us "
              f"= {row['wrapper_pct_of_step']:.4f} % (step delta: medians {row['step_overhead_pct']:+.2f} %, "
              f"paired {row['step_paired_pct']:+.2f} %)")
except Exception as e:
    print("no overhead json:", e)
PY
