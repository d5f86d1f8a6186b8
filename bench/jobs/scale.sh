# scale-out (issue #15): parallel memory trials vs sequential, a 2-rank torchrun job with per-rank reports
# (bench/gpu_scale.py, ~4 min; env SCALE_SKIP)
# limit: 300 s
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OUT="${OUT:-$PWD/gpu-scale-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHON="$PY"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))'
"$PY" bench/gpu_scale.py
