# the allocator-config model against real torch: ~50 settings, each in a fresh process; torch's accept/reject +
# message and the allocator_settings it ran with vs alloctune's prediction (tests/test_config_gpu.py, 1-2 min)
# limit: 180 s
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -m pytest -q -rsx -m gpu -p no:cacheprovider -o addopts="" tests/test_config_gpu.py 2>&1 | tee "$OUT/config_check.txt"
