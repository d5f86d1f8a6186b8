# Shared by the GPU batch scripts (bench/gpu_batch*.sh): `. bench/gpu_lib.sh` from the repo root.

# gpu_env: the repo's own alloctune on the path, unbuffered output, the native simulator core
# built if it can be (else the pure-Python twin runs).
gpu_env() {
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  python3 setup.py build_ext --inplace -q >/dev/null 2>&1 || echo "native core not built: the Python simulator is used"
}

# tune_ranks DIR LIMIT [LINES]: `alloctune tune` of the 2-rank torchrun job (gloo, both ranks on
# this GPU, default options) into DIR (tune.json, tune.stderr, the store), killed after LIMIT s;
# prints its rc and wall time, then the last LINES lines of its trial table.
tune_ranks() {
  local dir=$1 limit=$2 lines=${3:-16} torchrun t0 rc
  torchrun="$(command -v torchrun || echo "$(dirname "$(command -v python3)")/torchrun")"
  mkdir -p "$dir"
  t0=$(date +%s)
  timeout "$limit" python3 -m alloctune tune --json --store "$dir/trials.jsonl" -- \
    "$torchrun" --nproc-per-node 2 bench/scale_ranks_workload.py --items 24 --backend gloo \
    >"$dir/tune.json" 2>"$dir/tune.stderr"
  rc=$?
  echo "ranks tune rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a "$dir/tune.stderr"
  tail -"$lines" "$dir/tune.stderr"
}
