"""The one GPU driver: run named jobs on the device, each with its own time limit, outputs packed.

    python bench/gpu.py --list                       # every job, one line each
    python bench/gpu.py JOB[:SECONDS] ...            # one after another (wall times mean what they say)
    python bench/gpu.py --parallel JOB[:SECONDS] ... # side by side (memory results are per-process caps)
    python bench/gpu.py --dry-run JOB ...            # print each job's shell commands, run nothing

Each job runs in the repository root under bash with the repo's `src` on PYTHONPATH, unbuffered
output, `OUT` set to its own folder `$ROOT/JOB` (ROOT: `--out` or `$OUT`, default /tmp/gpu-out),
the native simulator core built once, `$TORCHRUN` and the helper `tune_ranks DIR LIMIT [LINES]`
defined; its output goes to `$OUT/log.txt` and the last lines to the terminal. After every job
everything is packed into `ROOT/gpu-results.tar.gz`, so a device call cut short still brings back
what finished, and one line per job (name, rc, seconds, exact command) is appended to
`ROOT/jobs.tsv`. Raw device output never goes into git: copy what a doc needs into
`bench/results/` as a summary.

Jobs take their parameters from the environment (`JOBS=3 TRIAL_TIMEOUT=300 python bench/gpu.py
tune-real`); each job's text (`--dry-run`) says which. The numbered batches of earlier rounds
were these jobs:

    batch 13: --parallel tune-real:550 (JOBS=3 TRIAL_TIMEOUT=300) truth:550 (JOBS=5 DEADLINE=530
              WORKLOADS=hubert,rvc,diffusion SETTINGS=max_split_256,max_split_512 SKIP_DONE=...)
              scale:300 (SCALE_SKIP=context,search,tune_cli,multi) ranks-tune:240 pytest-gpu:300
    batch 14: ranks-tune:150 (LIMIT=150 LINES=25) tune-real:170 (ONLY=timm,diffusion TRIAL_TIMEOUT=110)
    batch 15: driver-cost:120 tune-real:450 (TRIAL_TIMEOUT=150; ONLY=... to choose)
    batch 16: tune-real:150 (ONLY=rvc TRIAL_TIMEOUT=140) roundup-check:200 pytest-gpu:200
    batch 17: a: tune-real:560 (TRIAL_TIMEOUT=150); b: ranks-tune (LIMIT=200) throughput-measure:250
    batch 18: ranks-tune (LIMIT=120 LINES=12) pytest-gpu:110
    batch A:  recordings:520 (JOBS=12 DEADLINE=500), then bisections:560 (SIDECARS=<recordings>/a JOBS=14 DEADLINE=540)
    gpu_all.sh AREA:SECONDS ...: the same names (config, demo, diagnose, guard, ...) with this driver
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Job:
    doc: str
    script: str
    seconds: int = 240  # the default time limit


# Defined for every job: the environment of the old gpu_lib.sh, and the 2-rank torchrun tune.
PRELUDE = r"""
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
"""

JOBS: dict[str, Job] = {
    # ---- measurements that earlier rounds ran as numbered batches ------------------------------
    "tune-real": Job(
        "tunes of the bench/gpu_tune_real.py workloads (hubert, timm, torchvision, llama, rvc, diffusion); "
        "env: ONLY (comma list), JOBS side by side (default 1: wall time against one run means what it says), "
        "TRIAL_TIMEOUT per tune (default 150 s)",
        r"""
mkdir -p "$OUT/tune"
python3 bench/gpu_tune_real.py --out "$OUT/tune" --jobs "${JOBS:-1}" --timeout "${TRIAL_TIMEOUT:-150}" \
  ${ONLY:+--only "$ONLY"} >"$OUT/tune/stdout.txt" 2>&1
cat "$OUT/tune/summary.md"
""", 560),
    "truth": Job(
        "independent ground truth (bench/gpu_truth.py: min budget bisected per workload x setting, fresh processes); "
        "env: JOBS (5), DEADLINE (530 s), WORKLOADS, SETTINGS (comma lists), SKIP_DONE (a truth.jsonl already measured)",
        r"""
mkdir -p "$OUT/t"
python3 bench/gpu_truth.py --out "$OUT/t" --jobs "${JOBS:-5}" --deadline "${DEADLINE:-530}" \
  ${WORKLOADS:+--workloads "$WORKLOADS"} ${SETTINGS:+--settings "$SETTINGS"} ${SKIP_DONE:+--skip-done "$SKIP_DONE"} \
  >"$OUT/t/stdout.txt" 2>&1
rm -rf "$OUT/t/runs"
cp "$OUT/t/truth.jsonl" "$OUT/truth.jsonl" 2>/dev/null
tail -5 "$OUT/t/stdout.txt"
""", 550),
    "ranks-tune": Job(
        "issue #15: `alloctune tune` of a 2-rank torchrun job (gloo, both ranks on cuda:0), per-rank recordings "
        "simulated rank by rank; env: LIMIT (240 s), LINES of the trial table shown (16)",
        r"""
tune_ranks "$OUT/ranks_tune" "${LIMIT:-240}" "${LINES:-16}"
""", 260),
    "diagnose-cap": Job(
        "diagnose within a cap (bench/diagnose_cap_gpu.py): four library programs OOM under a cap with "
        "--on-oom snapshot, diagnosed with no flag, checked by real runs of every standard setting (~2 min)",
        r"""
python3 bench/diagnose_cap_gpu.py
""", 300),
    "record-stacks": Job(
        "the recording cost of Python stacks per allocation (bench/record_stacks_cost.py; sequential, ~3 min)",
        r"""
python3 bench/record_stacks_cost.py
""", 300),
    "plan-sharp": Job(
        "issue #28 data (bench/gpu_plan_sharp.py): HuBERT / timm / Llama recorded at 3 sizes, calibration runs, "
        "the real largest size under 2 caps x default/expandable by bisection; env: JOBS (12), DEADLINE (520 s)",
        r"""
python3 bench/gpu_plan_sharp.py --out "$OUT/d" --jobs "${JOBS:-12}" --deadline "${DEADLINE:-520}"
""", 560),
    "plan-points": Job(
        "issue #28 check (bench/gpu_plan_points.py): real runs at the sizes where plan's simulation says Llama / "
        "timm are not monotone in their size (24576 tokens; timm sides not multiples of 4) under truth.json's caps, "
        "34 fresh processes; env: JOBS (8), DEADLINE (300 s); copy points.json into tests/data/plan_sharp",
        r"""
python3 bench/gpu_plan_points.py --out "$OUT/d" --jobs "${JOBS:-8}" --deadline "${DEADLINE:-300}"
""", 330),
    "remedies": Job(
        "issue #29 data (bench/gpu_remedies.py): programs recorded by alloctune, and the same programs with each "
        "remedy applied by hand, real min budgets by bisection; env: JOBS (8), DEADLINE (520 s), ONLY (comma list "
        "of programs, e.g. det,det_ec)",
        r"""
python3 bench/gpu_remedies.py --out "$OUT/d" --jobs "${JOBS:-8}" --deadline "${DEADLINE:-520}" ${ONLY:+--only "$ONLY"}
""", 560),
    "tune-sharp": Job(
        "issue #28: tune of four real models (HuBERT, Llama generate, DeepLabV3, ConvNeXt) under budgets where the "
        "default fails (bench/gpu_tune_real.py --budgets sharp), one at a time: runs and wall time against one run; "
        "env ONLY, TRIAL_TIMEOUT (150), THROUGHPUT (measure: the tunes' --throughput measure)",
        r"""
mkdir -p "$OUT/tune"
python3 bench/gpu_tune_real.py --out "$OUT/tune" --jobs 1 --timeout "${TRIAL_TIMEOUT:-150}" --budgets sharp \
  --only "${ONLY:-hubert,llama,seg,convnext,hubert_grad}" ${THROUGHPUT:+--throughput "$THROUGHPUT"} >"$OUT/tune/stdout.txt" 2>&1
cat "$OUT/tune/summary.md"
""", 480),
    "plan-confirm": Job(
        "issue #28 item 4: `plan --confirm` of the plan-sharp recordings (env PLAN_DATA: that job's folder, "
        "CASES: workload:c1|c2:default|expandable,...), against the real largest sizes it bisected",
        r"""
python3 bench/gpu_plan_confirm.py --data "${PLAN_DATA:?PLAN_DATA: the plan-sharp folder}" --out "$OUT" \
  ${CASES:+--cases "$CASES"}
""", 420),
    "train": Job(
        "issue #36 ground truth (bench/gpu_train.py): bert / encoder / vit training recorded as written, with "
        "checkpointing, with SGD and at two micro-batches; real min budgets of each by bisection; the largest "
        "micro-batch under 3/4 of the program's own min budget; env: JOBS (8), DEADLINE (480 s), ONLY (comma list), "
        "BATCH_SIZES (only record at these batch sizes, no accumulation: plan's batch-size law); "
        "then: python bench/train_remedies.py --truth DIR (on a CPU)",
        r"""
python3 bench/gpu_train.py --out "$OUT" --jobs "${JOBS:-8}" --deadline "${DEADLINE:-480}" ${ONLY:+--only "$ONLY"} \
  ${BATCH_SIZES:+--batch-sizes "$BATCH_SIZES"} \
  >"$OUT/stdout.txt" 2>&1
grep -v '"kind": "recording"' "$OUT/stdout.txt" | tail -30
""", 540),
    "train-tune": Job(
        "issue #36 end to end: `alloctune tune` of the BERT fine-tune under 6 GiB (no setting fits; the checkpointing "
        "run confirms), of the logits-keeping loop under 8.3 GiB (the leak named), and `run --checkpointing --record` "
        "of bert / encoder / vit (the agent's switch, against the hand-written min budgets in tests/data/train_gpu)",
        r"""
for m in bert encoder vit; do
  python3 -m alloctune run --checkpointing --record "$OUT/agentckpt_$m.pickle" --json -- \
    python3 bench/train_programs.py "$m" --facts "$OUT/agentckpt_$m.facts.json" >"$OUT/agentckpt_$m.json" \
    2>"$OUT/agentckpt_$m.stderr" && xz -T0 -6 "$OUT/agentckpt_$m.pickle" &
done
tune_train bert6 6GiB 280 25 bert &
tune_train leak 8.3GiB 280 25 bert --keep-logits --steps 12 &
wait
for m in bert encoder vit; do echo "agentckpt $m:"; head -c 600 "$OUT/agentckpt_$m.json"; echo; done
""", 330),
    "train-confirm": Job(
        "issues #36/#37 checks left by the last session (about 2.5 min): tune of the BERT fine-tune under 6 GiB (the "
        "checkpointing run now reaches the agent: does the named remedy really fit?), tune of the logits-keeping loop "
        "under 7.9 GiB (no setting fits: is the leak named?), a calibration run of the Faster R-CNN program at 2.35 GiB "
        "(explain's empty_cache remedy with learned fallbacks: tests/data/remedies_gpu det_cal_mid), the batch program "
        "against the micro-batched one at the sizes where plan and the real micro-batch differ (vit 42/43, encoder "
        "21/22), and the trainer hooks' GPU test",
        r"""
cr() { local tag=$1 cap=$2; shift 2
  python3 -m alloctune run --budget "${cap}B" --json -- python3 bench/train_programs.py "$@" >"$OUT/cap_$tag.json" 2>&1
  echo "$tag $(grep -o '"outcome": "[a-z]*"' "$OUT/cap_$tag.json" | head -1)" >>"$OUT/caps.txt"; }
tune_train bert6 6GiB 150 8 bert &
tune_train leak 7.9GiB 150 8 bert --keep-logits --steps 12 &
python3 -m alloctune run --budget 2.35GiB --record "$OUT/det_cal_mid.pickle" --json -- \
  python3 bench/cap_programs.py det >"$OUT/det_cal_mid.json" 2>&1 &
python3 -m pytest -q -rs -m gpu -p no:cacheprovider -o addopts="" tests/test_integrations.py >"$OUT/pytest.txt" 2>&1 &
for n in 42 43; do cr "vit_b$n" 4601056758 vit --batch "$n" & cr "vit_mb$n" 4601056758 vit --micro-batch "$n" & done
for n in 21 22; do cr "enc_b$n" 9004907451 encoder --batch "$n" & cr "enc_mb$n" 9004907451 encoder --micro-batch "$n" & done
wait
xz -T0 -6 "$OUT"/*.pickle 2>/dev/null
tail -4 "$OUT/pytest.txt"; sort "$OUT/caps.txt"
""", 200),
    "nograd-truth": Job(
        "issue #37 carry-over 4 on the card at hand (about 3.5 min): the agent's --no-grad recording of HuBERT, the "
        "hand-written no-grad program's real min budget bisected, then its calibration runs (mid, tight, low); the "
        "min budget from those calibrations against the bisection of the same card (tests/data/remedies_gpu holds an "
        "H200 bisection and an H100 low-cap run, which disagree by more than the bar)",
        r"""
python3 bench/gpu_remedies.py --out "$OUT/d" --jobs 8 --deadline 160 --only hubert_nograd >"$OUT/log1.txt" 2>&1
tail -3 "$OUT/log1.txt"
python3 bench/gpu_remedies.py --out "$OUT/d" --jobs 8 --deadline 50 --only hubert_nograd --calibrate >"$OUT/log2.txt" 2>&1
tail -3 "$OUT/log2.txt"; rm -rf "$OUT/d/runs"; xz -T0 "$OUT"/d/*.pickle 2>/dev/null
""", 240),
    "pytest-gpu": Job(
        "every GPU-marked test (pytest -m gpu)",
        r"""
python3 -m pytest -q -rs -m gpu -p no:cacheprovider -o addopts="" tests >"$OUT/pytest_gpu.txt" 2>&1
echo "pytest rc=$?"; tail -3 "$OUT/pytest_gpu.txt"
""", 300),
    "driver-cost": Job(
        "driver call costs (bench/driver_cost.py): the constants of the confirm flow's throughput bound",
        r"""
python3 bench/driver_cost.py --reps "${REPS:-30}" --out "$OUT/driver_cost.md" 2>&1 | tail -20
""", 120),
    "roundup-check": Job(
        "the default check: torchvision tuned with --knobs roundup, where roundup_power2_divisions:4 is simulated "
        "best but really needs more than the default (bench/results/fallible_gpu.md)",
        r"""
mkdir -p "$OUT/roundup"
t0=$(date +%s)
python3 -m alloctune tune --knobs roundup --json --store "$OUT/roundup/trials.jsonl" -- \
  python3 bench/real_workloads.py torchvision --count 4 --quiet >"$OUT/roundup/tune.json" 2>"$OUT/roundup/tune.stderr"
echo "roundup tune rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/roundup/tune.stderr"
tail -22 "$OUT/roundup/tune.stderr"
rm -rf "$OUT/roundup/trials.d"
""", 200),
    "throughput-measure": Job(
        "rvc tuned with --throughput measure (the A/B path, Welch's t)",
        r"""
mkdir -p "$OUT/measure"
t0=$(date +%s)
python3 -m alloctune tune --throughput measure --json --store "$OUT/measure/trials.jsonl" -- \
  python3 -m alloctune.workloads.rvc --count 2 --quiet >"$OUT/measure/tune.json" 2>"$OUT/measure/tune.stderr"
echo "rvc --throughput measure rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/measure/tune.stderr"
tail -12 "$OUT/measure/tune.stderr"
rm -rf "$OUT/measure/trials.d" "$OUT/measure/trials.jsonl.lock"
""", 250),
    "recordings": Job(
        "real recordings (bench/gpu_recordings.py record): real-library workloads under three settings with "
        "history, C++ stacks, capped calibration runs, size sweeps; env: JOBS (12), DEADLINE (500 s)",
        r"""
python3 bench/gpu_recordings.py record --out "$OUT/a" --jobs "${JOBS:-12}" --deadline "${DEADLINE:-500}"
""", 520),
    "bisections": Job(
        "independent min-budget and largest-size bisections (bench/gpu_recordings.py bisect) from the recordings "
        "job's sidecars; env: SIDECARS (folder, required), JOBS (14), DEADLINE (540 s)",
        r"""
python3 bench/gpu_recordings.py bisect --sidecars "$SIDECARS" --out "$OUT/b" --jobs "${JOBS:-14}" \
  --deadline "${DEADLINE:-540}"
""", 560),
    # ---- one job per area (the former bench/gpu_<area>.sh) ------------------------------------
    "config": Job(
        "the allocator-config model: ~50 settings, each in a fresh process; torch's accept/reject + message and the allocator_settings it ran with vs alloctune's prediction ($OUT/config_probe.{json,md}, 1-2 min)",
        r"""
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 bench/gpu_config.py
""", 180
    ),
    "demo": Job(
        "`alloctune demo --gpu` (tunes the RVC workload under 5.5 GiB with --simulate-first, ~5 min) and `pytest -m gpu`; env: DEMO_TIMEOUT_S (400)",
        r"""
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 COLUMNS=120
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
if python3 -c "import pytest" 2>/dev/null; then
  timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ > "$OUT/pytest_gpu.txt" 2>&1
  echo "pytest rc=$?"; tail -n 3 "$OUT/pytest_gpu.txt"
fi
# the demo keeps its sweep store under ~/.cache/alloctune; a HOME under $OUT brings the trials back
start=$(date +%s)
HOME="$OUT/home" timeout -k 10 "${DEMO_TIMEOUT_S:-400}" python3 -m alloctune demo --gpu > "$OUT/demo.txt" 2>&1
echo "demo rc=$? $(( $(date +%s) - start ))s"
find "$OUT/home" -name '*.jsonl' -exec cp {} "$OUT/demo_store.jsonl" \; 2>/dev/null
tail -n 40 "$OUT/demo.txt"
""", 450
    ),
    "diagnose": Job(
        "`alloctune diagnose` on real OOMs (shortage, cap, contention, fragmentation), and the recommended fix re-run on the fragmentation workload ($OUT/gpu_diagnose.{json,md}, ~1 min)",
        r"""
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 bench/gpu_diagnose.py
""", 150
    ),
    "fallible-calib": Job(
        "calibration recordings for the fallible-request model (bench/tune_fallible.py): capped 1 % above the default's bisected min budget, plus C++-stack recordings of two convnets (~1 min)",
        r"""
set -u
OUT=${OUT:-/tmp/out/fallible-calib}
mkdir -p "$OUT/a"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
run() { echo "== $*" >&2; timeout 120 python bench/capwrap.py "$@" || echo "   (exit $?)" >&2; }
run --out "$OUT/a/hubert_default_cap_min" --cap 871744000 --record -- bench/real_workloads.py hubert &
run --out "$OUT/a/timm_default_cap_min" --cap 268695000 --record -- bench/real_workloads.py timm &
run --out "$OUT/a/torchvision_default_cap_min" --cap 220920000 --record -- bench/real_workloads.py torchvision &
wait
run --out "$OUT/a/timm_default_cpp" --record --stacks all -- bench/real_workloads.py timm &
run --out "$OUT/a/torchvision_default_cpp" --record --stacks all -- bench/real_workloads.py torchvision &
wait
tar -C "$OUT" -czf "$OUT/fallible_calib.tar.gz" a && rm -rf "$OUT/a"
ls -la "$OUT"
""", 150
    ),
    "guard": Job(
        "alloctune.guard: chunked RVC decoder on a 300 s clip under 4 GiB, Janitor vs never / every-request empty_cache (default and expandable), oom_retry overhead, tests/test_guard_gpu.py (~4-5 min)",
        r"""
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

timeout -k 5 200 python3 bench/guard_gpu.py --out "$OUT" --seconds 300 --budget 4GiB --requests 200 \
  --time-limit-b 120
echo "guard_gpu rc=$?"
mkdir -p "$OUT/expandable"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout -k 5 130 python3 bench/guard_gpu.py \
  --out "$OUT/expandable" --parts b --requests 200 --time-limit-b 100
echo "guard_gpu (expandable) rc=$?"

timeout -k 5 45 python3 bench/guard_overhead.py --device cuda --rounds 150 \
  --json "$OUT/guard_overhead_gpu.json" --results "$OUT/guard_overhead_gpu.md"
echo "guard_overhead rc=$?"

if python3 -c "import pytest" 2>/dev/null; then
  timeout -k 5 50 python3 -m pytest -q -p no:cacheprovider tests/test_guard_gpu.py > "$OUT/pytest_gpu.txt" 2>&1
  echo "pytest rc=$?"; tail -n 3 "$OUT/pytest_gpu.txt"
else
  echo "pytest not installed: skipped tests/test_guard_gpu.py"
fi

echo "================ summary ================"
python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
def load(path):
    try:
        return json.loads(path.read_text())
    except Exception as e:
        print("no", path, e); return {}
r = load(out / "guard_gpu.json")
a = r.get("a")
if a:
    c = a["chunked_first_call"]
    bud = f"{a['budget'] / 2**30:.2f} GiB" if isinstance(a["budget"], int) else a["budget"]
    print(f"(a) {a['seconds']:.0f}s clip, budget {bud}: plain={a['plain_under_budget']['outcome']} "
          f"chunked pieces={c['pieces']} halvings={c['halvings']} final={c['final_chunk']} frames "
          f"len_ok={c['same_length']} max_abs_diff={c['max_abs_diff']:.2e} -> {'PASS' if a['pass'] else 'FAIL'}")
for b in (r.get("b"), load(out / "expandable" / "guard_gpu.json").get("b")):
    if not b:
        continue
    print(f"(b) allocator {b.get('alloc_conf') or 'default'}")
    print(f"    {'order':17} {'policy':22} {'empties':>7} {'peak res MiB':>12} {'peak alloc MiB':>14} {'ratio':>6} {'vs every':>8}")
    for order, v in b["orders"].items():
        for x in v["runs"]:
            print(f"    {order:17} {x['policy']:22} {x['empty_cache_calls']:7d} {x.get('peak_reserved', 0) / 2**20:12.1f} "
                  f"{x.get('peak_allocated', 0) / 2**20:14.1f} {x.get('reserved_over_allocated', float('nan')):6.3f} "
                  f"{x.get('reserved_over_every', float('nan')):8.3f}")
    print("    verdicts (literal / floor):", {k: (v["literal"], v["floor"]) for k, v in b["verdicts"].items()})
try:
    o = json.loads((out / "guard_overhead_gpu.json").read_text())
    for row in o["rows"]:
        print(f"(c) {row['variant']:14} step {o['plain_median_ms']:.2f} ms, wrapper {row['wrapper_us']:.2f} us "
              f"= {row['wrapper_pct_of_step']:.4f} % (step delta: medians {row['step_overhead_pct']:+.2f} %, "
              f"paired {row['step_paired_pct']:+.2f} %)")
except Exception as e:
    print("no overhead json:", e)
PY
""", 330
    ),
    "hostile": Job(
        "issue #19 item 4: killing alloctune (run: SIGKILL/SIGTERM/SIGHUP, tune: SIGKILL) frees the GPU: no workload pid left, memory back ($OUT/hostile-gpu.txt)",
        r"""
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
""", 240
    ),
    "monitor": Job(
        "`alloctune watch` beside `alloctune run` (live numbers = the agent's final report), a fragmentation OOM snapshot explained by `diagnose --snapshot` and `report`, the recommended setting run for real (~1 min)",
        r'''
set -uo pipefail
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$(mktemp -d)}"
WORK="$(mktemp -d)"
export ALLOCTUNE_STATE_DIR="$WORK/live"
mkdir -p "$OUT" "$WORK/live" "$WORK/oom"
PY="${PYTHON:-python3}"
AT=("$PY" -m alloctune)

cat > "$WORK/frag.py" <<'EOF'
"""Pins 14 segments with one small live block each, then (phase oom) asks for more than fits."""
import sys, time
import torch

MiB = 1 << 20
phase = sys.argv[1]
dev = torch.device("cuda")
keep, hole = [], []
for i in range(14):
    big = torch.empty(64 * MiB, dtype=torch.uint8, device=dev)       # a fresh 64 MiB segment
    del big                                                            # cached, whole
    keep.append(torch.empty(24 * MiB, dtype=torch.uint8, device=dev))  # carved from its start
    hole.append(torch.empty(40 * MiB, dtype=torch.uint8, device=dev))  # takes the exact 40 MiB rest
    time.sleep(0.1)
del hole  # 14 segments: 24 MiB live + 40 MiB free each (896 MiB reserved, 336 MiB allocated)
s = torch.cuda.memory_stats()
print(f"pinned: reserved {s['reserved_bytes.all.current']} allocated {s['allocated_bytes.all.current']}", flush=True)
if phase == "oom":
    x = torch.empty(200 * MiB, dtype=torch.uint8, device=dev)     # 896 MiB reserved + 200 MiB > 1 GiB budget
    print("the 200 MiB request fit", flush=True)
else:
    y = torch.empty(100 * MiB, dtype=torch.uint8, device=dev)     # fits: one more segment
    del y
    time.sleep(3.0)  # let watch see the final peaks (the agent samples every second)
print("throughput: 1 items/s", flush=True)
EOF

echo "== 1. watch beside alloctune run"
"${AT[@]}" watch --interval 0.5 --json > "$OUT/watch.jsonl" 2> "$WORK/watch.err" &
WATCH_PID=$!
sleep 2
"${AT[@]}" run --budget 1GiB --json -- "$PY" "$WORK/frag.py" hold > "$OUT/run.json" 2> "$WORK/run.err"
echo "run exit code: $?"; tail -3 "$WORK/run.err"
sleep 1
kill "$WATCH_PID" 2>/dev/null; wait "$WATCH_PID" 2>/dev/null
head -c 600 "$WORK/watch.err"

echo "== 2. OOM under --on-oom snapshot"
( cd "$WORK/oom" && "${AT[@]}" run --budget 1GiB --on-oom snapshot --json -- "$PY" "$WORK/frag.py" oom \
    > "$OUT/oom_run.json" 2> "$WORK/oom_run.err" )
echo "oom run exit code: $? (1 expected: the program died of the OOM)"
SNAP="$(ls "$WORK"/oom/oom-snapshot.*.pickle 2>/dev/null | head -1)"
if [ -n "$SNAP" ]; then
    cp "$SNAP" "$OUT/oom-snapshot.pickle"
    "${AT[@]}" diagnose --snapshot "$SNAP" --budget 1GiB --json > "$OUT/diagnosis.json" 2> "$WORK/diag.err"
    echo "diagnose --snapshot exit code: $?"; head -c 400 "$WORK/diag.err"
    "${AT[@]}" diagnose --snapshot "$SNAP" --budget 1GiB | tee "$WORK/diag.txt" | head -40
    "${AT[@]}" report "$SNAP" --out "$WORK/report" --title "alloctune GPU OOM snapshot" > /dev/null 2> "$WORK/report.err"
    echo "report exit code: $?"; head -c 400 "$WORK/report.err"
    [ -f "$WORK/report/report.html" ] && cp "$WORK/report/report.html" "$OUT/report.html"
    FIX="$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1])).get('recommendation') or '')" "$OUT/diagnosis.json" 2>/dev/null)"
    if [ -n "$FIX" ]; then
        echo "== 3. the recommended setting, for real: $FIX"
        ( cd "$WORK/oom" && "${AT[@]}" run --budget 1GiB --conf "$FIX" --json -- "$PY" "$WORK/frag.py" oom \
            > "$OUT/fix_run.json" 2> "$WORK/fix_run.err" )
        echo "fixed run exit code: $?"; grep -m1 "request fit" "$WORK/fix_run.err"
    fi
else
    echo "no oom-snapshot.*.pickle was written; stderr of the run:"; tail -20 "$WORK/oom_run.err"
fi

echo "== summary"
"$PY" - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows, ok = [], True

def check(name, cond, detail=""):
    global ok
    ok &= bool(cond)
    rows.append((name, "PASS" if cond else "FAIL", detail))

try:
    run = json.loads((out / "run.json").read_text())
except Exception as exc:
    run = {}
    check("alloctune run --json", False, repr(exc))
final = run.get("stats") or {}
check("run outcome ok", run.get("outcome") == "ok", f"outcome={run.get('outcome')} error={run.get('error')}")
seen = []
for line in (out / "watch.jsonl").read_text().splitlines() if (out / "watch.jsonl").exists() else []:
    s = json.loads(line)
    for g in s["gpus"]:
        for p in g["processes"]:
            a = p.get("allocator")
            if a and "frag.py" in a.get("cmd", ""):
                seen.append((s["time"], g, p, a))
check("watch saw the run's live stats", bool(seen), f"{len(seen)} samples")
if seen:
    _, g, p, a = seen[-1]
    st = a["stats"]
    for key in ("reserved_bytes.all.peak", "allocated_bytes.all.peak", "segment.all.peak", "num_alloc_retries",
                "num_ooms", "inactive_split_bytes.all.peak"):
        check(f"watch == final report: {key}", st.get(key) == final.get(key), f"{st.get(key)} vs {final.get(key)}")
    used = p.get("used")
    check("NVML used >= reserved (context included)", used is None or used >= st.get("reserved_bytes.all.current", 0),
          f"nvml {used} vs reserved {st.get('reserved_bytes.all.current')}; pid seen by NVML: {used is not None}")
try:
    oom = json.loads((out / "oom_run.json").read_text())
except Exception:
    oom = {}
check("oom run outcome oom", oom.get("outcome") == "oom", f"outcome={oom.get('outcome')}")
check("oom snapshot written", (out / "oom-snapshot.pickle").exists(), str(oom.get("oom_snapshot")))
try:
    d = json.loads((out / "diagnosis.json").read_text())
except Exception:
    d = {}
MiB = 1 << 20
check("diagnosis: state read at the OOM", d.get("state_source") == "snapshot-at-oom", str(d.get("state_source")))
check("diagnosis: fragmentation", d.get("verdict") == "fragmentation", str(d.get("summary")))
check("diagnosis: largest free block 40 MiB < 200 MiB", d.get("largest_free") == 40 * MiB and d.get("request") == 200 * MiB,
      f"largest_free={d.get('largest_free')} request={d.get('request')}")
check("diagnosis: 14 pinned segments", d.get("pinned_count") == 14, f"pinned={d.get('pinned_count')} free={d.get('pinned_free')}")
w = {x["config"]: x for x in d.get("what_if", [])}
check("what-if: recorded setting reproduces the OOM", (w.get("") or {}).get("avoids_oom") is False, str(w.get("")))
check("what-if: a setting serves the request", d.get("recommendation") is not None, str(d.get("recommendation")))
try:
    fix = json.loads((out / "fix_run.json").read_text())
except Exception:
    fix = {}
check("recommended setting, run for real: ok", fix.get("outcome") == "ok",
      f"conf={fix.get('conf')} outcome={fix.get('outcome')} peak_reserved={fix.get('peak_reserved')}")
html = (out / "report.html").read_text() if (out / "report.html").exists() else ""
import re
remote = re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, re.I)
check("report.html self-contained", bool(html) and not remote and "<script" not in html
      and 'src="data:image/png;base64,' in html, f"{len(html)} chars, {len(remote)} remote refs")
print("| check | result | detail |\n|---|---|---|")
for r in rows:
    print("| " + " | ".join(str(c).replace("|", "/") for c in r) + " |")
print("ALL PASS" if ok else "SOME CHECKS FAILED")
EOF
rm -rf "$WORK"
echo "results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
''', 180
    ),
    "plan": Job(
        "capacity planning through `alloctune record --size` (RVC at five lengths), `alloctune plan` (held-back size, two caps x two settings), and the predicted largest length run for real (~3 min)",
        r"""
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
""", 300
    ),
    "scale": Job(
        "scale-out (issue #15): parallel memory trials vs sequential, a 2-rank torchrun job with per-rank reports (bench/gpu_scale.py, ~4 min; env SCALE_SKIP)",
        r"""
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OUT="${OUT:-$PWD/gpu-scale-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHON="$PY"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))'
"$PY" bench/gpu_scale.py
""", 300
    ),
    "simulate": Job(
        "simulator fidelity on traces recorded right now: a seeded random workload under 7 settings, replayed and compared by bench/fidelity.py (~2-3 min; env STEPS, SEED)",
        r"""
set -eu
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"
work="$(mktemp -d)"
mkdir -p "$OUT" "$work/synth"
python3 bench/gpu_sim_workload.py --out "$work/synth" --steps "${STEPS:-20000}" --seed "${SEED:-1}" | tee "$OUT/record.txt"
python3 bench/fidelity.py --traces "$work" --workloads synth \
  --runs default,max_split_64,expandable,roundup4,default_cap90,expandable_cap90,gc06_split64_cap100 \
  --no-append | tee "$OUT/fidelity.txt"
tar cf "$OUT/synth_traces.tar" -C "$work" synth
ls -la "$OUT"
""", 240
    ),
    "trace": Job(
        "alloctune.trace: six small histories whose truth is known (empty_cache() calls, failed sizes, a side stream, a cap with GC, expandable), loaded and compared (~1 min)",
        r"""
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
""", 150
    ),
    "tune": Job(
        "the agent, `alloctune run` and `alloctune tune` (tests/test_agent_gpu.py, then bench/gpu_tune.py: run / tune / grid / simulate-first on the fragmenting workload; ~3-5 min)",
        r"""
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OUT="${OUT:-$PWD/gpu-tune-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHON="$PY"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))'
# 1) the agent's GPU tests (real CUDA: budget, OOM observer, settings read back), if pytest is there
if "$PY" -c 'import pytest' 2>/dev/null; then
  "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_agent_gpu.py 2>&1 | tail -n 15 | tee "$OUT/pytest_gpu.txt"
else
  echo "pytest not installed: skipping tests/test_agent_gpu.py (gpu_tune.py below covers the same paths)"
fi
# 2) run / tune / grid / simulate-first on the fragmenting workload; prints the summary table
"$PY" bench/gpu_tune.py
""", 330
    ),
    "workloads": Job(
        "the reference workloads rvc, diffusion, llm, train under default / expandable / max_split_128 (fresh process each, recorded), then replayed and compared by bench/fidelity.py (~5 min; env WORKLOADS_JOBS, WORKLOADS_DEADLINE_S)",
        r"""
set -u
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp/out}"
mkdir -p "$out"
python3 -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__, '|', torch.cuda.get_device_name(0))"
# --deadline-s: runs that would start after the deadline are skipped (and listed), so the whole script
# stays within its slot even if a workload is slower than expected; --timeout caps any single run.
python3 bench/record_workloads.py --out "$out" --record-all --jobs "${WORKLOADS_JOBS:-4}" --deadline-s "${WORKLOADS_DEADLINE_S:-420}" --timeout 200 2>&1 | tee "$out/workloads_log.txt"
rc=${PIPESTATUS[0]}
ls -lR "$out/traces"
# compact copies (pickle-free, a few tens of KB) for shipping in the package
mkdir -p "$out/atrace"
for f in "$out"/traces/*/*.pickle.xz; do
  [ -e "$f" ] || continue
  n=$(basename "$(dirname "$f")"); c=$(basename "$f" .pickle.xz)
  python3 -m alloctune trace convert "$f" "$out/atrace/${n}_${c}.atrace" > /dev/null || echo "convert failed: $f"
done
python3 bench/fidelity.py --traces "$out/traces" --workloads rvc,diffusion,llm,train \
  --runs default,expandable,max_split_128 --no-append 2>&1 | tee "$out/fidelity.txt"
if python3 -c "import pytest" 2>/dev/null; then
  timeout -k 5 45 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_workloads.py tests/test_workloads_record.py \
    > "$out/pytest_gpu.txt" 2>&1
  echo "pytest rc=$?"; tail -n 3 "$out/pytest_gpu.txt"
fi
echo "gpu_workloads: exit $rc"
exit $rc
""", 560
    ),
}


def parse_spec(spec: str) -> tuple[str, int]:
    name, _, secs = spec.partition(":")
    if name not in JOBS:
        raise SystemExit(f"gpu.py: error: unknown job {name!r}; known: {', '.join(sorted(JOBS))}")
    try:
        return name, int(secs) if secs else JOBS[name].seconds
    except ValueError:
        raise SystemExit(f"gpu.py: error: {spec!r}: the time limit must be whole seconds") from None


def script_of(name: str, out: Path) -> str:
    return PRELUDE + f'export OUT={shlex.quote(str(out / name))}\nmkdir -p "$OUT"\n' + JOBS[name].script


def start(name: str, secs: int, out: Path) -> subprocess.Popen:
    log = open(out / name / "log.txt", "wb")
    cmd = ["timeout", "-k", "10", str(secs), "bash", "-c", script_of(name, out)]
    return subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def finish(name: str, proc: subprocess.Popen, t0: float, out: Path, spec: str) -> None:
    rc = proc.wait()
    wall = time.monotonic() - t0
    print(f"== {name} rc={rc} {wall:.0f}s", flush=True)
    lines = (out / name / "log.txt").read_text(errors="replace").splitlines()
    print("\n".join(lines[-25:]), flush=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with open(out / "jobs.tsv", "a") as fh:
        fh.write(f"{stamp}\t{name}\trc={rc}\t{wall:.0f}s\tpython bench/gpu.py {spec}\n")
    pack(out)


def pack(out: Path) -> None:
    tmp = out / "gpu-results.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for p in sorted(out.iterdir()):
            if not p.name.startswith("gpu-results.tar.gz"):
                tar.add(p, arcname=p.name)
    tmp.replace(out / "gpu-results.tar.gz")


def environment(out: Path) -> None:
    probe = ("date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; "
             "python3 -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.cuda.is_available())'; "
             "python3 setup.py build_ext --inplace -q >/dev/null 2>&1 "
             "|| echo 'native core not built: the Python simulator is used'")
    text = subprocess.run(["bash", "-c", probe], cwd=REPO, capture_output=True, text=True).stdout
    (out / "env.txt").write_text(text)
    print(text, end="", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("jobs", nargs="*", metavar="JOB[:SECONDS]")
    ap.add_argument("--list", action="store_true", help="print every job and its default time limit")
    ap.add_argument("--parallel", action="store_true", help="run the jobs side by side, not one after another")
    ap.add_argument("--dry-run", action="store_true", help="print each job's shell commands, run nothing")
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp/gpu-out", help="where outputs go (default $OUT)")
    a = ap.parse_args(argv)
    if a.list or not a.jobs:
        width = max(map(len, JOBS))
        print(f"{'job':{width}}  limit  what")
        for name, job in JOBS.items():
            print(f"{name:{width}}  {job.seconds:4d}s  {job.doc}")
        return 0
    specs = [(s, *parse_spec(s)) for s in a.jobs]
    out = Path(a.out).resolve()
    if a.dry_run:
        for _, name, secs in specs:
            print(f"# ---- {name} (limit {secs} s)\n{script_of(name, out)}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for _, name, _ in specs:
        (out / name).mkdir(parents=True, exist_ok=True)
    environment(out)
    if a.parallel:
        running = [(spec, name, start(name, secs, out), time.monotonic()) for spec, name, secs in specs]
        for spec, name, proc, t0 in running:
            finish(name, proc, t0, out, spec)
    else:
        for spec, name, secs in specs:
            t0 = time.monotonic()
            finish(name, start(name, secs, out), t0, out, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
