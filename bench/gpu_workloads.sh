#!/usr/bin/env bash
# GPU evidence for the reference workloads (about 3-4 minutes on one H200): each of rvc, diffusion,
# llm and train at full size under the default allocator, expandable_segments:True and
# max_split_size_mb:128 (a fresh process each), with peak allocated / peak reserved / utilization /
# wall time; the default run of each is recorded through `alloctune record` into $OUT/NAME.pickle.xz.
# Run from the repo root:  bash bench/gpu_workloads.sh
# Results in $OUT: rvc/diffusion/llm/train.pickle.xz, workloads_results.json, workloads_results.md
# (a section for bench/RESULTS.md), workloads_log.txt.
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp/out}"
mkdir -p "$out"
python3 -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__, '|', torch.cuda.get_device_name(0))"
# --deadline-s: runs that would start after 200 s are skipped (and listed), so the whole script stays
# under ~4 minutes even if a workload is slower than expected; --timeout caps any single run.
python3 bench/record_workloads.py --out "$out" --deadline-s 200 --timeout 120 2>&1 | tee "$out/workloads_log.txt"
rc=${PIPESTATUS[0]}
ls -l "$out"
echo "gpu_workloads: exit $rc"
exit $rc
