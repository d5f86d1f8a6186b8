# the reference workloads rvc, diffusion, llm, train under default / expandable / max_split_128 (fresh process each,
# recorded), then replayed and compared by bench/fidelity.py (~5 min; env WORKLOADS_JOBS, WORKLOADS_DEADLINE_S)
# limit: 560 s
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
  --runs default,expandable,max_split_128 --out "$out/fidelity.md" 2>&1 | tee "$out/fidelity.txt"
if python3 -c "import pytest" 2>/dev/null; then
  timeout -k 5 45 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_workloads.py tests/test_workloads_record.py \
    > "$out/pytest_gpu.txt" 2>&1
  echo "pytest rc=$?"; tail -n 3 "$out/pytest_gpu.txt"
fi
echo "gpu_workloads: exit $rc"
exit $rc
