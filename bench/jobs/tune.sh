# the agent, `alloctune run` and `alloctune tune` (tests/test_agent_gpu.py, then bench/gpu_tune.py strategies: tune /
# grid / simulate-first on the fragmenting workload; ~3-5 min)
# limit: 330 s
PY="${PYTHON:-python3}"
export PYTHON="$PY"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))'
# 1) the agent's GPU tests (real CUDA: budget, OOM observer, settings read back), if pytest is there
if "$PY" -c 'import pytest' 2>/dev/null; then
  "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_agent_gpu.py 2>&1 | tail -n 15 | tee "$OUT/pytest_gpu.txt"
else
  echo "pytest not installed: skipped tests/test_agent_gpu.py"
fi
# 2) tune / grid / simulate-first on the fragmenting workload; prints the summary table
"$PY" bench/gpu_tune.py strategies
