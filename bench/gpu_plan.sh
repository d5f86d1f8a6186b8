#!/usr/bin/env bash
# GPU evidence for capacity planning through alloctune's own recording path (about 3 minutes on one H200):
# 1. `alloctune record --size` records the RVC workload at five audio lengths (one unsplit file each, a fresh
#    process per size, ALLOCTUNE_SIZE set, sidecars written) into $OUT/rvc/;
# 2. `alloctune plan` on that directory: held back 40 s (fit on the others), largest length under two caps and
#    two settings, the RVC card table, JSON + PNG;
# 3. the real check of one answer: the predicted largest length under a 1.5 GiB cap (default setting), and one
#    step (1 s) above it, each run for real under that cap (`alloctune run --budget`), fresh processes.
# Run from the repo root:  bash bench/gpu_plan.sh
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp/out}"
mkdir -p "$out/rvc"
wl=(python3 -m alloctune.workloads.rvc --count 1 --quiet --min-seconds "{size}" --max-seconds "{size}")
timeout 300 python3 -m alloctune record --size 10,25,40,55,60 --out "$out/rvc/rvc.pickle.xz" --json -- "${wl[@]}" \
  > "$out/record.json" 2> "$out/log.txt"
echo "record rc=$?"; tail -n 3 "$out/log.txt"
timeout 200 python3 -m alloctune plan "$out/rvc" --hold-back 40 --cap 1.5GiB --cap 2.25GiB \
  -c "" -c expandable_segments:True --max-size 60 --save "$out/rvc.atraceset" --png "$out/rvc_plan.png" --json \
  > "$out/plan.json" 2>> "$out/log.txt"
echo "plan rc=$?"; tail -n 3 "$out/log.txt"
python3 - "$out/plan.json" <<'PY' > "$out/check_sizes.txt"
import json, sys
d = json.load(open(sys.argv[1]))
h = d["holdout"]
print("holdout", h["size"], "error_vs_real", h["error_vs_real"], "error_vs_replay", h["error_vs_replay"])
x = d["settings"][0]["largest"][0]
print("predicted", x["label"], x["largest"], "optimistic", x["optimistic"], "wall", d["total_wall_s"])
print("predicted_size", x["largest"])
PY
cat "$out/check_sizes.txt"
pred=$(awk '/^predicted_size/ {print $2}' "$out/check_sizes.txt")
if [ -n "$pred" ] && [ "$pred" != "None" ]; then
  for s in "$pred" "$((pred + 1))"; do
    timeout 120 python3 -m alloctune run --budget 1.5GiB --json -- python3 -m alloctune.workloads.rvc --count 1 --quiet \
      --min-seconds "$s" --max-seconds "$s" > "$out/real_$s.json" 2>&1
    echo "real run at $s s under 1.5GiB: rc=$?"
  done
fi
tar -czf "$out/plan_rvc.tar.gz" -C "$out" rvc rvc.atraceset 2>/dev/null && rm -rf "$out/rvc"
ls -l "$out"
