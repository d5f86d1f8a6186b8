# issue #28 data (bench/gpu_plan_sharp.py): HuBERT / timm / Llama recorded at 3 sizes, calibration runs, the real
# largest size under 2 caps x default/expandable by bisection; env: JOBS (12), DEADLINE (520 s)
# limit: 560 s
python3 bench/gpu_plan_sharp.py --out "$OUT/d" --jobs "${JOBS:-12}" --deadline "${DEADLINE:-520}"
