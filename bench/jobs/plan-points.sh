# issue #28 check (bench/gpu_plan_points.py): real runs at the sizes where plan's simulation says Llama / timm are not
# monotone in their size (24576 tokens; timm sides not multiples of 4) under truth.json's caps, 34 fresh processes;
# env: JOBS (8), DEADLINE (300 s); copy points.json into tests/data/plan_sharp
# limit: 330 s
python3 bench/gpu_plan_points.py --out "$OUT/d" --jobs "${JOBS:-8}" --deadline "${DEADLINE:-300}"
