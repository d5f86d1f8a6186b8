# diagnose within a cap (bench/diagnose_cap_gpu.py): four library programs OOM under a cap with --on-oom snapshot,
# diagnosed with no flag, checked by real runs of every standard setting (~2 min)
# limit: 300 s
python3 bench/diagnose_cap_gpu.py
