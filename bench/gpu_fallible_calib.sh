#!/usr/bin/env bash
# Calibration recordings for the fallible-request model (bench/tune_fallible.py), ~1 minute on one H200.
#
# The batch A calibration runs of timm and torchvision were capped below their real min_budget and died
# on a fatal OOM, so nothing could be learned from them. These are capped 1 % above the independent
# bisection's min_budget of the default setting (gpu-data/b/bisect_results.json: hubert 863113870,
# timm 266034721, torchvision 218733103 bytes), where the real runs completed with 40-80 cuDNN fallbacks.
# Plus uncapped C++-stack recordings of the two convnets, to check the frame tagger beyond HuBERT.
#
#   bash bench/gpu_fallible_calib.sh            # writes $OUT/*.json + *.pickle.xz, then tars them
# Afterwards (CPU): copy them into /work/gpu-data/a and run
#   python bench/tune_fallible.py --calibration cap_min
set -u
OUT=${OUT:-bench/gpu-results/fallible_calib}
mkdir -p "$OUT/a"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
run() { echo "== $*" >&2; timeout 120 python bench/capwrap.py "$@" || echo "   (exit $?)" >&2; }
run --out "$OUT/a/hubert_default_cap_min" --cap 871744000 --record -- bench/real_workloads.py hubert &
run --out "$OUT/a/timm_default_cap_min" --cap 268695000 --record -- bench/real_workloads.py timm &
run --out "$OUT/a/torchvision_default_cap_min" --cap 220920000 --record -- bench/real_workloads.py torchvision &
wait
run --out "$OUT/a/timm_default_cpp" --record --stacks all -- bench/real_workloads.py timm &
run --out "$OUT/a/torchvision_default_cpp" --record --stacks all -- bench/real_workloads.py torchvision &
wait
tar -C "$OUT" -czf "$OUT/fallible_calib.tar.gz" a && rm -rf "$OUT/a"
ls -la "$OUT"
