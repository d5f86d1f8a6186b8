#!/usr/bin/env bash
# Run several areas' GPU scripts (bench/gpu_<area>.sh) in one device call, each with its own time limit,
# and pack every area's output into one archive ($OUT/gpu-results.tar.gz) because only a few files come back.
#   usage: bash bench/gpu_all.sh AREA[:SECONDS] ...      e.g. bash bench/gpu_all.sh workloads:240 guard:120
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
final_out="${OUT:-/tmp/out}"
work=/tmp/gpu-out
rm -rf "$work" && mkdir -p "$work" "$final_out"
trap 'tar czf "$final_out/gpu-results.tar.gz" -C "$work" . 2>/dev/null' TERM
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
} 2>&1 | tee "$work/env.txt"
for spec in "$@"; do
  area="${spec%%:*}"
  secs="${spec#*:}"; [ "$secs" = "$spec" ] && secs=240
  export OUT="$work/$area"
  mkdir -p "$OUT"
  start=$(date +%s)
  timeout -k 10 "$secs" bash "bench/gpu_$area.sh" > "$OUT/log.txt" 2>&1
  rc=$?
  echo "== $area rc=$rc $(( $(date +%s) - start ))s"
  tail -n 25 "$OUT/log.txt"
  # re-pack after every area, so a call cut short still brings back what finished
  tar czf "$final_out/gpu-results.tar.gz.tmp" -C "$work" . && mv "$final_out/gpu-results.tar.gz.tmp" "$final_out/gpu-results.tar.gz"
done
ls -la "$final_out"
