# `alloctune diagnose` on real OOMs (shortage, cap, contention, fragmentation), and the recommended fix re-run on the
# fragmentation workload (tests/test_diagnose_gpu.py, ~1 min)
# limit: 150 s
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -m pytest -q -rs -m gpu -p no:cacheprovider -o addopts="" tests/test_diagnose_gpu.py 2>&1 | tee "$OUT/diagnose_check.txt"
