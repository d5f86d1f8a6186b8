# driver call costs (bench/driver_cost.py): the constants of the confirm flow's throughput bound
# limit: 120 s
python3 bench/driver_cost.py --reps "${REPS:-30}" --out "$OUT/driver_cost.md" 2>&1 | tail -20
