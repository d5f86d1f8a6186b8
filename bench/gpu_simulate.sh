#!/usr/bin/env bash
# Simulator fidelity on traces recorded right now (not the ones it was developed on).
# Records a seeded random workload (palette sizes, a side stream, empty_cache, caught OOMs)
# under 7 settings (4 uncapped, 3 capped) on the GPU, then replays and compares each one with
# bench/fidelity.py: own addresses / default's addresses (hinted) / predicted (model).
# Run from the repo root on the GPU machine:  bash bench/gpu_simulate.sh   (~2-3 min)
set -eu
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"
work="$(mktemp -d)"
mkdir -p "$OUT" "$work/synth"
python3 bench/gpu_sim_workload.py --out "$work/synth" --steps "${STEPS:-20000}" --seed "${SEED:-1}" | tee "$OUT/record.txt"
python3 bench/fidelity.py --traces "$work" --workloads synth \
  --runs default,max_split_64,expandable,roundup4,default_cap90,expandable_cap90,gc06_split64_cap100 \
  --no-append | tee "$OUT/fidelity.txt"
tar cf "$OUT/synth_traces.tar" -C "$work" synth
ls -la "$OUT"
