# real recordings (bench/gpu_recordings.py record): real-library workloads under three settings with history, C++
# stacks, capped calibration runs, size sweeps; env: JOBS (12), DEADLINE (500 s)
# limit: 520 s
python3 bench/gpu_recordings.py record --out "$OUT/a" --jobs "${JOBS:-12}" --deadline "${DEADLINE:-500}"
