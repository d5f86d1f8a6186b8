# `alloctune demo --gpu` (tunes the RVC workload under 5.5 GiB with --simulate-first, ~5 min) and `pytest -m gpu`;
# env: DEMO_TIMEOUT_S (400)
# limit: 450 s
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 COLUMNS=120
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
if python3 -c "import pytest" 2>/dev/null; then
  timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ > "$OUT/pytest_gpu.txt" 2>&1
  echo "pytest rc=$?"; tail -n 3 "$OUT/pytest_gpu.txt"
fi
# the demo keeps its sweep store under ~/.cache/alloctune; a HOME under $OUT brings the trials back
start=$(date +%s)
HOME="$OUT/home" timeout -k 10 "${DEMO_TIMEOUT_S:-400}" python3 -m alloctune demo --gpu > "$OUT/demo.txt" 2>&1
echo "demo rc=$? $(( $(date +%s) - start ))s"
find "$OUT/home" -name '*.jsonl' -exec cp {} "$OUT/demo_store.jsonl" \; 2>/dev/null
tail -n 40 "$OUT/demo.txt"
