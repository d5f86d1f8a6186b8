#!/usr/bin/env bash
# GPU batch 13 (one H200, ~9 min, everything side by side; memory results are per-process caps, so
# unaffected by the load; wall times and throughput are measured under it):
#   1. the six tunes of bench/gpu_tune_real.py (new flow), three at a time, on the truth's own commands;
#   2. the rest of the ground truth (max_split_size_mb:256/512) for the workloads whose segments reach them
#      (timm, torchvision, llama: largest segment 62 / 46 / 64 MiB, so those settings act exactly as the default);
#   3. issue #15: a 2-rank torchrun job (gloo, both ranks on cuda:0) recorded, bisected with two trials
#      side by side (each its own rendezvous port), and tuned by the CLI with per-rank reports;
#   4. pytest -m gpu (the agent as split into settings / torch_hook / watchdog).
# Run from the repo root:  OUT=/tmp/b13 bash bench/gpu_batch13.sh
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/gpu-batch13-out}"
mkdir -p "$OUT/t" "$OUT/tune" "$OUT/scale" "$OUT/ranks_tune"
python3 setup.py build_ext --inplace -q >/dev/null 2>&1 || echo "native core not built: the Python simulator is used"
TORCHRUN="$(command -v torchrun || echo "$(dirname "$(command -v python3)")/torchrun")"

timeout 550 python3 bench/gpu_tune_real.py --out "$OUT/tune" --jobs 3 --timeout 300 >"$OUT/tune/stdout.txt" 2>&1 &
timeout 550 python3 bench/gpu_truth.py --out "$OUT/t" --jobs 5 --deadline 530 --workloads hubert,rvc,diffusion \
  --settings max_split_256,max_split_512 --skip-done bench/gpu-results/batch12/truth.jsonl >"$OUT/t/stdout.txt" 2>&1 &
( OUT="$OUT/scale" SCALE_SKIP=context,search,tune_cli,multi timeout 300 python3 bench/gpu_scale.py >"$OUT/scale/stdout.txt" 2>&1
  timeout 240 python3 -m alloctune tune --json --store "$OUT/ranks_tune/trials.jsonl" -- \
    "$TORCHRUN" --nproc-per-node 2 bench/scale_ranks_workload.py --items 24 --backend gloo \
    >"$OUT/ranks_tune/tune.json" 2>"$OUT/ranks_tune/tune.stderr"; echo "ranks tune rc=$?" >>"$OUT/ranks_tune/tune.stderr" ) &
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -o addopts="" >"$OUT/pytest_gpu.txt" 2>&1 &
wait
rm -rf "$OUT/t/runs"
tar czf "$OUT/rest.tgz" -C "$OUT" t scale ranks_tune tune/stdout.txt 2>/dev/null
cp "$OUT/t/truth.jsonl" "$OUT/truth_rest.jsonl" 2>/dev/null
rm -rf "$OUT/t" "$OUT/scale" "$OUT/ranks_tune" "$OUT/tune/stdout.txt"
ls -la "$OUT" "$OUT/tune"
cat "$OUT/tune/summary.md" 2>/dev/null; tail -3 "$OUT/pytest_gpu.txt"
