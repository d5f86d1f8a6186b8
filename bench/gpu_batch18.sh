#!/usr/bin/env bash
# GPU batch 18 (one H200, ~3 min): the 2-rank torchrun job tuned again with the per-rank throughput
# bound, then pytest -m gpu on the final code. Run from the repo root:  OUT=/tmp/b18 bash bench/gpu_batch18.sh
set -u
. bench/gpu_lib.sh
gpu_env
OUT="${OUT:-$PWD/gpu-batch18-out}"
mkdir -p "$OUT/ranks"
tune_ranks "$OUT/ranks" 120 12
rm -rf "$OUT/ranks/trials.d" "$OUT/ranks/trials.rank"*.d "$OUT/ranks/trials.jsonl.lock"
timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -3 | tee "$OUT/pytest_gpu.txt"
