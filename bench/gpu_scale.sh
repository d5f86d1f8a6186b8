#!/usr/bin/env bash
# GPU evidence for scale-out (issue #15) on one H200, ~4 min: parallel memory trials vs sequential,
# and a 2-rank torchrun job (gloo, both ranks on cuda:0) with per-rank reports and recordings.
# Run from the repo root:  bash bench/gpu_scale.sh      (results in $OUT, default ./gpu-scale-out)
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OUT="${OUT:-$PWD/gpu-scale-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHON="$PY"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))'
"$PY" bench/gpu_scale.py
