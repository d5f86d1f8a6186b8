# independent ground truth (bench/gpu_recordings.py truth: min budget bisected per workload x setting, fresh processes); env:
# JOBS (5), DEADLINE (530 s), WORKLOADS, SETTINGS (comma lists), SKIP_DONE (a truth.jsonl already measured)
# limit: 550 s
mkdir -p "$OUT/t"
python3 bench/gpu_recordings.py truth --out "$OUT/t" --jobs "${JOBS:-5}" --deadline "${DEADLINE:-530}" \
  ${WORKLOADS:+--workloads "$WORKLOADS"} ${SETTINGS:+--settings "$SETTINGS"} ${SKIP_DONE:+--skip-done "$SKIP_DONE"} \
  >"$OUT/t/stdout.txt" 2>&1
rm -rf "$OUT/t/runs"
cp "$OUT/t/truth.jsonl" "$OUT/truth.jsonl" 2>/dev/null
tail -5 "$OUT/t/stdout.txt"
