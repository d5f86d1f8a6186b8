# the allocator-config model: ~50 settings, each in a fresh process; torch's accept/reject + message and the
# allocator_settings it ran with vs alloctune's prediction ($OUT/config_probe.{json,md}, 1-2 min)
# limit: 180 s
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 bench/gpu_config.py
