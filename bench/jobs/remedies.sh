# issue #29 data (bench/gpu_remedies.py): programs recorded by alloctune, and the same programs with each remedy
# applied by hand, real min budgets by bisection; env: JOBS (8), DEADLINE (520 s), ONLY (comma list of programs, e.g.
# det,det_ec)
# limit: 560 s
python3 bench/gpu_remedies.py --out "$OUT/d" --jobs "${JOBS:-8}" --deadline "${DEADLINE:-520}" ${ONLY:+--only "$ONLY"}
