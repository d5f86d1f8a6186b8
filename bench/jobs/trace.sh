# alloctune.trace: six small histories whose truth is known (empty_cache() calls, failed sizes, a side stream, a cap
# with GC, expandable), loaded and compared (~1 min)
# limit: 150 s
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp/out}"
work="$(mktemp -d /tmp/gpu-trace.XXXXXX)"
mkdir -p "$out"
status=0
for s in ec_levels ec_bigger record_stream cap_oom gc_cap expandable; do
  if ! timeout -k 5 60 python3 bench/gpu_trace.py record "$s" "$work" > "$work/$s.log" 2>&1; then
    echo "record $s FAILED:"; tail -n 15 "$work/$s.log"; status=1
  fi
done
python3 -m alloctune trace info "$work/cap_oom.pickle.xz" > "$out/trace_info.txt" 2>&1
python3 -m alloctune trace info "$work/record_stream.pickle.xz" --json >> "$out/trace_info.txt" 2>&1
tar czf "$out/trace_snapshots.tar.gz" -C "$work" .
python3 bench/gpu_trace.py check "$work" 2>&1 | tee "$out/trace_check.txt"
rc=${PIPESTATUS[0]}
[ "$rc" -ne 0 ] && status=1
echo "gpu_trace: exit $status"
exit $status
