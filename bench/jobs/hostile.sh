# issue #19 item 4: killing alloctune (run: SIGKILL/SIGTERM/SIGHUP, tune: SIGKILL) frees the GPU: no workload pid
# left, memory back ($OUT/hostile-gpu.txt)
# limit: 240 s
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
work=$(mktemp -d)
cat > "$work/hold.py" <<'EOF'
import os, subprocess, sys, time, torch
x = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")          # 8 GiB held by the child
kid = subprocess.Popen([sys.executable, "-c",
    "import torch, time; y = torch.empty(4 << 30, dtype=torch.uint8, device='cuda'); time.sleep(600)"])
time.sleep(3)
open(sys.argv[1] + ".t", "w").write(f"{os.getpid()} {kid.pid}")
os.replace(sys.argv[1] + ".t", sys.argv[1])
time.sleep(600)
EOF
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
apps() { nvidia-smi --query-compute-apps=pid --format=csv,noheader | tr -d ' ' | sort | tr '\n' ' '; }
report="$OUT/hostile-gpu.txt"
{
  echo "baseline: used $(used) MiB, compute pids: $(apps)"
  fails=0
  for case in "run KILL" "run TERM" "run HUP" "tune KILL"; do
    set -- $case
    marker="$work/pids.$1.$2"
    if [ "$1" = run ]; then
      python -m alloctune run -- python "$work/hold.py" "$marker" > "$work/log.$1.$2" 2>&1 &
    else
      python -m alloctune tune --store "$work/s.$2.jsonl" --knobs expandable -- python "$work/hold.py" "$marker" \
        > "$work/log.$1.$2" 2>&1 &
    fi
    apid=$!
    for _ in $(seq 1 120); do [ -f "$marker" ] && break; sleep 0.5; done
    pids=$(cat "$marker" 2>/dev/null)
    echo "== $1 SIG$2: workload pids $pids, used $(used) MiB, compute pids: $(apps)"
    kill -s "$2" "$apid"; wait "$apid" 2>/dev/null; echo "   alloctune exit $?"
    sleep 15
    left=""
    for p in $pids; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
    echo "   after 15 s: used $(used) MiB, compute pids: $(apps), workload pids alive:${left:- none}"
    if [ -n "$left" ]; then fails=$((fails + 1)); kill -9 $left 2>/dev/null; fi
  done
  echo "RESULT: $fails of 4 cases left a workload on the GPU"
} 2>&1 | tee "$report"
