# tunes of the bench/gpu_tune.py real workloads (hubert, timm, torchvision, llama, rvc, diffusion); env: ONLY (comma
# list), JOBS side by side (default 1: wall time against one run means what it says), TRIAL_TIMEOUT per tune (default
# 150 s)
# limit: 560 s
mkdir -p "$OUT/tune"
python3 bench/gpu_tune.py real --out "$OUT/tune" --jobs "${JOBS:-1}" --timeout "${TRIAL_TIMEOUT:-150}" \
  ${ONLY:+--only "$ONLY"} >"$OUT/tune/stdout.txt" 2>&1
cat "$OUT/tune/summary.md"
