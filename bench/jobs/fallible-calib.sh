# calibration recordings for the fallible-request model (bench/capwrap.py): capped 1 % above the default's
# bisected min budget, plus C++-stack recordings of two convnets (~1 min)
# limit: 150 s
set -u
OUT=${OUT:-/tmp/out/fallible-calib}
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
