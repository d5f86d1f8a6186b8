# alloctune.trace on the GPU: six small histories whose truth is known (empty_cache() calls, failed sizes, a side
# stream, a cap with GC, expandable), recorded and loaded by tests/test_trace_gpu.py (~1 min)
# limit: 150 s
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -m pytest -q -rs -m gpu -p no:cacheprovider -o addopts="" tests/test_trace_gpu.py 2>&1 | tee "$OUT/trace_check.txt"
