#!/usr/bin/env bash
# GPU evidence for `alloctune diagnose`: real OOMs (shortage, cap, contention, fragmentation) parsed and
# diagnosed, and the recommended fix re-run on the fragmentation workload (must hold more live memory).
# Run from the repo root: OUT=/tmp/out bash bench/gpu_diagnose.sh   (≈1 min; writes $OUT/gpu_diagnose.{json,md})
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 bench/gpu_diagnose.py
