# empty_cache() calls marked by the agent against the inference of them (bench/empty_cache_inference.py record):
# rvc_ec1 and a probe program, uncapped and under a 1 GiB cap, then scored ($OUT/empty_cache.md; kept as
# bench/results/empty_cache_gpu.md; ~1 min)
# limit: 180 s
python3 bench/empty_cache_inference.py record --out "$OUT"
