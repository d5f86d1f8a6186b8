#!/usr/bin/env bash
# GPU batch 16 (one H200, ~4 min), everything alone on the GPU, one after another:
#   1. rvc tuned again after the throughput fixes (the driver-work bound counts bytes; Welch t test);
#   2. the default check: torchvision with --knobs roundup, where roundup_power2_divisions:4 is
#      simulated best but really needs more than the default (bench/results/fallible_gpu.md);
#   3. pytest -m gpu.
# Run from the repo root:  OUT=/tmp/b16 bash bench/gpu_batch16.sh
set -u
. bench/gpu_lib.sh
gpu_env
OUT="${OUT:-$PWD/gpu-batch16-out}"
mkdir -p "$OUT/tune" "$OUT/roundup"
timeout 150 python3 bench/gpu_tune_real.py --out "$OUT/tune" --jobs 1 --timeout 140 --only rvc >"$OUT/tune/stdout.txt" 2>&1
cat "$OUT/tune/summary.md"
t0=$(date +%s)
timeout 200 python3 -m alloctune tune --knobs roundup --json --store "$OUT/roundup/trials.jsonl" -- \
  python3 bench/real_workloads.py torchvision --count 4 --quiet >"$OUT/roundup/tune.json" 2>"$OUT/roundup/tune.stderr"
echo "roundup tune rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/roundup/tune.stderr"
tail -22 "$OUT/roundup/tune.stderr"
rm -rf "$OUT/roundup/trials.d"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -4 | tee "$OUT/pytest_gpu.txt"
