# capacity planning through `alloctune record --size` (RVC at five lengths), `alloctune plan` (held-back size, two
# caps x two settings), and the predicted largest length run for real (~3 min)
# limit: 300 s
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp/out}"
mkdir -p "$out/rvc"
wl=(python3 -m alloctune.workloads.rvc --count 1 --quiet --min-seconds "{size}" --max-seconds "{size}")
timeout 300 python3 -m alloctune record --size 10,25,40,55,60 --out "$out/rvc/rvc.pickle.xz" --json -- "${wl[@]}" \
  > "$out/record.json" 2> "$out/log.txt"
echo "record rc=$?"; tail -n 3 "$out/log.txt"
timeout 200 python3 -m alloctune plan "$out/rvc" --hold-back 40 --cap 1.5GiB --cap 2.25GiB \
  -c "" -c expandable_segments:True --max-size 60 --save "$out/rvc.atraceset" --png "$out/rvc_plan.png" --json \
  > "$out/plan.json" 2>> "$out/log.txt"
echo "plan rc=$?"; tail -n 3 "$out/log.txt"
python3 - "$out/plan.json" <<'PY' > "$out/check_sizes.txt"
import json, sys
d = json.load(open(sys.argv[1]))
h = d["holdout"]
print("holdout", h["size"], "error_vs_real", h["error_vs_real"], "error_vs_replay", h["error_vs_replay"])
x = d["settings"][0]["largest"][0]
print("predicted", x["label"], x["largest"], "optimistic", x["optimistic"], "wall", d["total_wall_s"])
print("predicted_size", x["largest"])
PY
cat "$out/check_sizes.txt"
pred=$(awk '/^predicted_size/ {print $2}' "$out/check_sizes.txt")
if [ -n "$pred" ] && [ "$pred" != "None" ]; then
  for s in "$pred" "$((pred + 1))"; do
    timeout 120 python3 -m alloctune run --budget 1.5GiB --json -- python3 -m alloctune.workloads.rvc --count 1 --quiet \
      --min-seconds "$s" --max-seconds "$s" > "$out/real_$s.json" 2>&1
    echo "real run at $s s under 1.5GiB: rc=$?"
  done
fi
tar -czf "$out/plan_rvc.tar.gz" -C "$out" rvc rvc.atraceset 2>/dev/null && rm -rf "$out/rvc"
ls -l "$out"
