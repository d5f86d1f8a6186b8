# `alloctune diagnose` on real OOMs (shortage, cap, contention, fragmentation), and the recommended fix re-run on the
# fragmentation workload (bench/diagnose_cap_gpu.py provoked: $OUT/gpu_diagnose.{json,md}, ~1 min)
# limit: 150 s
python3 bench/diagnose_cap_gpu.py provoked
