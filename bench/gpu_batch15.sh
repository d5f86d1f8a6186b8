#!/usr/bin/env bash
# GPU batch 15 (one H200): the confirm flow with side by side memory runs, the default shown by the
# baseline and throughput runs only where the simulated allocator work could matter.
#   1. driver call costs (bench/driver_cost.py): the bound's constants;
#   2. tunes of the bench/gpu_tune_real.py workloads, ONE AT A TIME (wall time against one run means
#      what it says); which ones: $ONLY (default all six).
# Run from the repo root:  OUT=/tmp/b15 ONLY=hubert,timm bash bench/gpu_batch15.sh
set -u
. bench/gpu_lib.sh
gpu_env
OUT="${OUT:-$PWD/gpu-batch15-out}"
ONLY="${ONLY:-hubert,timm,torchvision,llama,rvc,diffusion}"
mkdir -p "$OUT/tune"
if [ "${COST:-1}" = 1 ]; then
  timeout 120 python3 bench/driver_cost.py --reps 30 --out "$OUT/driver_cost.md" 2>&1 | tail -20
fi
timeout "${TUNE_LIMIT:-450}" python3 bench/gpu_tune_real.py --out "$OUT/tune" --jobs 1 --timeout 150 --only "$ONLY" \
  >"$OUT/tune/stdout.txt" 2>&1
cat "$OUT/tune/summary.md"
