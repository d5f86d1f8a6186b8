#!/usr/bin/env bash
# GPU evidence for alloctune.trace (about 1 minute): record six small histories whose truth is known
# (empty_cache() calls, failed request sizes, a side stream with record_stream, a cap with GC, expandable
# segments), then load them with alloctune and compare. Run from the repo root:  bash bench/gpu_trace.sh
# Results: $OUT/trace_check.txt (the table), $OUT/trace_info.txt, $OUT/trace_snapshots.tar.gz (the recordings).
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
