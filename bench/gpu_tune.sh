#!/usr/bin/env bash
# GPU evidence for the agent, `alloctune run` and `alloctune tune` (one H200, ~3-5 min).
# Run from the repo root:  bash bench/gpu_tune.sh        (results in $OUT, default ./gpu-tune-out)
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OUT="${OUT:-$PWD/gpu-tune-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHON="$PY"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))'
# 1) the agent's GPU tests (real CUDA: budget, OOM observer, settings read back), if pytest is there
if "$PY" -c 'import pytest' 2>/dev/null; then
  "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_agent_gpu.py 2>&1 | tail -n 15 | tee "$OUT/pytest_gpu.txt"
else
  echo "pytest not installed: skipping tests/test_agent_gpu.py (gpu_tune.py below covers the same paths)"
fi
# 2) run / tune / grid / simulate-first on the fragmenting workload; prints the summary table
"$PY" bench/gpu_tune.py
