# the default check: torchvision tuned with --knobs roundup, where roundup_power2_divisions:4 is simulated best but
# really needs more than the default (bench/results/fallible_gpu.md)
# limit: 200 s
mkdir -p "$OUT/roundup"
t0=$(date +%s)
python3 -m alloctune tune --knobs roundup --json --store "$OUT/roundup/trials.jsonl" -- \
  python3 bench/real_workloads.py torchvision --count 4 --quiet >"$OUT/roundup/tune.json" 2>"$OUT/roundup/tune.stderr"
echo "roundup tune rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/roundup/tune.stderr"
tail -22 "$OUT/roundup/tune.stderr"
rm -rf "$OUT/roundup/trials.d"
