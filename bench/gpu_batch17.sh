#!/usr/bin/env bash
# GPU batch 17 (one H200): the flow as committed, everything alone on the GPU, one after another.
#   PART=a: the six bench/gpu_tune_real.py workloads, one tune at a time (~4 min);
#   PART=b: a 2-rank torchrun job tuned with the default executor (its memory runs side by side,
#           every rank booked), and rvc with --throughput measure (the A/B path, Welch's t).
# Run from the repo root:  OUT=/tmp/b17 PART=a bash bench/gpu_batch17.sh
set -u
. bench/gpu_lib.sh
gpu_env
OUT="${OUT:-$PWD/gpu-batch17-out}"
mkdir -p "$OUT"
if [ "${PART:-a}" = a ]; then
  mkdir -p "$OUT/tune"
  timeout 560 python3 bench/gpu_tune_real.py --out "$OUT/tune" --jobs 1 --timeout 150 >"$OUT/tune/stdout.txt" 2>&1
  cat "$OUT/tune/summary.md"
  exit 0
fi
mkdir -p "$OUT/ranks" "$OUT/measure"
tune_ranks "$OUT/ranks" 200 16
t0=$(date +%s)
timeout 250 python3 -m alloctune tune --throughput measure --json --store "$OUT/measure/trials.jsonl" -- \
  python3 -m alloctune.workloads.rvc --count 2 --quiet >"$OUT/measure/tune.json" 2>"$OUT/measure/tune.stderr"
echo "rvc --throughput measure rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/measure/tune.stderr"
tail -12 "$OUT/measure/tune.stderr"
rm -rf "$OUT/ranks/trials.d" "$OUT/ranks/trials.rank"*.d "$OUT/measure/trials.d" "$OUT"/*/trials.jsonl.lock
tar czf "$OUT/b.tgz" -C "$OUT" ranks measure && rm -rf "$OUT/ranks" "$OUT/measure"
