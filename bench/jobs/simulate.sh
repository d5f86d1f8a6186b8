# simulator fidelity on traces recorded right now: a seeded random workload under 7 settings (bench/gpu_trace.py synth),
# replayed and compared by bench/fidelity.py (~2-3 min; env STEPS, SEED)
# limit: 240 s
set -e
work="$(mktemp -d)"
mkdir -p "$OUT" "$work/synth"
python3 bench/gpu_trace.py synth --out "$work/synth" --steps "${STEPS:-20000}" --seed "${SEED:-1}" | tee "$OUT/record.txt"
python3 bench/fidelity.py --traces "$work" --workloads synth \
  --runs default,max_split_64,expandable,roundup4,default_cap90,expandable_cap90,gc06_split64_cap100 \
  --out "$OUT/fidelity.md" | tee "$OUT/fidelity.txt"
tar cf "$OUT/synth_traces.tar" -C "$work" synth
ls -la "$OUT"
