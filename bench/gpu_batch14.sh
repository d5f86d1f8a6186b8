#!/usr/bin/env bash
# GPU batch 14 (one H200, ~5 min): everything ALONE on the GPU, one after another, so wall times mean
# what they say:
#   1. issue #15: `alloctune tune` of a 2-rank torchrun job (gloo, both ranks on cuda:0), per-rank
#      recordings simulated rank by rank (tune/rank_sim.py);
#   2. tunes of two workloads of bench/gpu_tune_real.py, one at a time: wall time against one run.
# Run from the repo root:  OUT=/tmp/b14 bash bench/gpu_batch14.sh
set -u
. bench/gpu_lib.sh
gpu_env
OUT="${OUT:-$PWD/gpu-batch14-out}"
mkdir -p "$OUT/ranks_tune" "$OUT/tune"
tune_ranks "$OUT/ranks_tune" 150 25
timeout 170 python3 bench/gpu_tune_real.py --out "$OUT/tune" --jobs 1 --timeout 110 --only timm,diffusion \
  >"$OUT/tune/stdout.txt" 2>&1
tar czf "$OUT/ranks.tgz" -C "$OUT" ranks_tune tune/stdout.txt && rm -rf "$OUT/ranks_tune" "$OUT/tune/stdout.txt"
cat "$OUT/tune/summary.md"
