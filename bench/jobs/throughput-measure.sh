# rvc tuned with --throughput measure (the A/B path, Welch's t)
# limit: 250 s
mkdir -p "$OUT/measure"
t0=$(date +%s)
python3 -m alloctune tune --throughput measure --json --store "$OUT/measure/trials.jsonl" -- \
  python3 -m alloctune.workloads.rvc --count 2 --quiet >"$OUT/measure/tune.json" 2>"$OUT/measure/tune.stderr"
echo "rvc --throughput measure rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/measure/tune.stderr"
tail -12 "$OUT/measure/tune.stderr"
rm -rf "$OUT/measure/trials.d" "$OUT/measure/trials.jsonl.lock"
