#!/usr/bin/env bash
# GPU batch 18 (one H200, ~3 min): the 2-rank torchrun job tuned again with the per-rank throughput
# bound, then pytest -m gpu on the final code. Run from the repo root:  OUT=/tmp/b18 bash bench/gpu_batch18.sh
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/gpu-batch18-out}"
mkdir -p "$OUT/ranks"
python3 setup.py build_ext --inplace -q >/dev/null 2>&1 || echo "native core not built: the Python simulator is used"
TORCHRUN="$(command -v torchrun || echo "$(dirname "$(command -v python3)")/torchrun")"
t0=$(date +%s)
timeout 120 python3 -m alloctune tune --json --store "$OUT/ranks/trials.jsonl" -- \
  "$TORCHRUN" --nproc-per-node 2 bench/scale_ranks_workload.py --items 24 --backend gloo \
  >"$OUT/ranks/tune.json" 2>"$OUT/ranks/tune.stderr"
echo "ranks tune rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/ranks/tune.stderr"
tail -12 "$OUT/ranks/tune.stderr"
rm -rf "$OUT/ranks/trials.d" "$OUT/ranks/trials.rank"*.d "$OUT/ranks/trials.jsonl.lock"
timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -3 | tee "$OUT/pytest_gpu.txt"
