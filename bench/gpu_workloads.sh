#!/usr/bin/env bash
# GPU evidence for the reference workloads (each run is a fresh process, 20-70 s with start-up; four side by
# side by default (WORKLOADS_JOBS), about 5 minutes on one H200, e.g. `bash bench/gpu_all.sh workloads:560`): each of rvc, diffusion,
# llm and train at full size under the default allocator, expandable_segments:True and
# max_split_size_mb:128 (a fresh process each), with peak allocated / peak reserved / utilization /
# wall time. Every run is recorded through `alloctune record` into $OUT/traces/NAME/CONF.pickle.xz,
# and then the simulator replays each workload's default request stream under the other two settings
# and is compared event by event with those recordings (bench/fidelity.py).
# Run from the repo root:  bash bench/gpu_workloads.sh
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp/out}"
mkdir -p "$out"
python3 -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__, '|', torch.cuda.get_device_name(0))"
# --deadline-s: runs that would start after the deadline are skipped (and listed), so the whole script
# stays within its slot even if a workload is slower than expected; --timeout caps any single run.
python3 bench/record_workloads.py --out "$out" --record-all --jobs "${WORKLOADS_JOBS:-4}" --deadline-s "${WORKLOADS_DEADLINE_S:-420}" --timeout 200 2>&1 | tee "$out/workloads_log.txt"
rc=${PIPESTATUS[0]}
ls -lR "$out/traces"
# compact copies (pickle-free, a few tens of KB) for shipping in the package
mkdir -p "$out/atrace"
for f in "$out"/traces/*/*.pickle.xz; do
  [ -e "$f" ] || continue
  n=$(basename "$(dirname "$f")"); c=$(basename "$f" .pickle.xz)
  python3 -m alloctune trace convert "$f" "$out/atrace/${n}_${c}.atrace" > /dev/null || echo "convert failed: $f"
done
python3 bench/fidelity.py --traces "$out/traces" --workloads rvc,diffusion,llm,train \
  --runs default,expandable,max_split_128 --no-append 2>&1 | tee "$out/fidelity.txt"
if python3 -c "import pytest" 2>/dev/null; then
  timeout -k 5 45 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_workloads.py tests/test_workloads_record.py \
    > "$out/pytest_gpu.txt" 2>&1
  echo "pytest rc=$?"; tail -n 3 "$out/pytest_gpu.txt"
fi
echo "gpu_workloads: exit $rc"
exit $rc
