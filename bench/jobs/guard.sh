# alloctune.guard: chunked RVC decoder on a 300 s clip under 4 GiB, Janitor vs never / every-request empty_cache
# (default and expandable), oom_retry overhead, tests/test_guard_gpu.py (~4-5 min)
# limit: 330 s
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

timeout -k 5 200 python3 bench/guard_gpu.py --out "$OUT" --seconds 300 --budget 4GiB --requests 200 \
  --time-limit-b 120
echo "guard_gpu rc=$?"
mkdir -p "$OUT/expandable"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout -k 5 130 python3 bench/guard_gpu.py \
  --out "$OUT/expandable" --parts b --requests 200 --time-limit-b 100
echo "guard_gpu (expandable) rc=$?"

timeout -k 5 45 python3 bench/guard_overhead.py --device cuda --rounds 150 \
  --json "$OUT/guard_overhead_gpu.json" --results "$OUT/guard_overhead_gpu.md"
echo "guard_overhead rc=$?"

if python3 -c "import pytest" 2>/dev/null; then
  timeout -k 5 50 python3 -m pytest -q -p no:cacheprovider tests/test_guard_gpu.py > "$OUT/pytest_gpu.txt" 2>&1
  echo "pytest rc=$?"; tail -n 3 "$OUT/pytest_gpu.txt"
else
  echo "pytest not installed: skipped tests/test_guard_gpu.py"
fi

echo "================ summary ================"
cat "$OUT/guard_gpu.md" "$OUT/expandable/guard_gpu.md" 2>/dev/null
