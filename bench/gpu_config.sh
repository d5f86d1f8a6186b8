#!/usr/bin/env bash
# GPU evidence for the allocator-config model: ~50 settings, each in a fresh process on the GPU;
# torch's accept/reject + message and the allocator_settings it really ran with vs alloctune's prediction.
# Run from the repo root: OUT=/tmp/out bash bench/gpu_config.sh   (≈1–2 min; writes $OUT/config_probe.{json,md})
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 bench/gpu_config.py
