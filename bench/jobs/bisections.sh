# independent min-budget and largest-size bisections (bench/gpu_recordings.py bisect) from the recordings job's
# sidecars; env: SIDECARS (folder, required), JOBS (14), DEADLINE (540 s)
# limit: 560 s
python3 bench/gpu_recordings.py bisect --sidecars "$SIDECARS" --out "$OUT/b" --jobs "${JOBS:-14}" \
  --deadline "${DEADLINE:-540}"
