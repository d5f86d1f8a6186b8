# Run before every job of bench/gpu.py (after it, OUT is exported and made).
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
gpu_env() { :; }  # the driver builds the native core once, before the first job
TORCHRUN="$(command -v torchrun || echo "$(dirname "$(command -v python3)")/torchrun")"
# tune_ranks DIR LIMIT [LINES]: `alloctune tune` of the 2-rank torchrun job (gloo, both ranks on
# this GPU, default options) into DIR (tune.json, tune.stderr, the store), killed after LIMIT s;
# prints its rc and wall time, then the last LINES lines of its trial table.
tune_ranks() {
  local dir=$1 limit=$2 lines=${3:-16} t0 rc
  mkdir -p "$dir"
  t0=$(date +%s)
  timeout "$limit" python3 -m alloctune tune --json --store "$dir/trials.jsonl" -- \
    "$TORCHRUN" --nproc-per-node 2 bench/scale_ranks_workload.py --items 24 --backend gloo \
    >"$dir/tune.json" 2>"$dir/tune.stderr"
  rc=$?
  echo "ranks tune rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a "$dir/tune.stderr"
  tail -"$lines" "$dir/tune.stderr"
  rm -rf "$dir/trials.d" "$dir/trials.rank"*.d "$dir/trials.jsonl.lock"
}
# tune_train NAME BUDGET LIMIT LINES ARGS...: `alloctune tune --budget BUDGET` of bench/train_programs.py ARGS
# into $OUT/NAME.tune.{json,stderr} and its store, killed after LIMIT s; its rc and wall time go to the log and
# the stderr file, then the last LINES lines of its trial table
tune_train() {
  local name=$1 budget=$2 limit=$3 lines=$4 t0; shift 4; t0=$(date +%s)
  timeout "$limit" python3 -m alloctune tune --budget "$budget" --json --store "$OUT/$name.trials.jsonl" -- \
    python3 bench/train_programs.py "$@" >"$OUT/$name.tune.json" 2>"$OUT/$name.tune.stderr"
  echo "$name tune rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/$name.tune.stderr"
  tail -"$lines" "$OUT/$name.tune.stderr"
  rm -rf "$OUT/$name.trials.d" "$OUT/$name.trials.jsonl.lock"
}
