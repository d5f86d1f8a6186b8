# every GPU-marked test (pytest -m gpu)
# limit: 300 s
python3 -m pytest -q -rs -m gpu -p no:cacheprovider -o addopts="" tests >"$OUT/pytest_gpu.txt" 2>&1
echo "pytest rc=$?"; tail -3 "$OUT/pytest_gpu.txt"
