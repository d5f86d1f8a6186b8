"""Training remedies against the GPU's ground truth (issue #36), on a CPU.

Reads the output of `bench/gpu.py train` (bench/gpu_train.py: recordings with the process's
own facts, real min budgets bisected on the GPU, the largest micro-batch under a cap) and
checks, per program:
* phases: the live bytes by phase sum exactly to allocated at the moment; the simulated peak
  allocated equals the one the process measured; the phase of the peak-allocated moment is the
  phase the process measured its peak in (reset_peak_memory_stats at each phase boundary);
* categories: model state and optimizer state against the tensors' own bytes;
* checkpointing: the simulated min budget of the rewritten recording against the real min
  budget of the same program with checkpointing written by hand (within 3 %);
* SGD: the simulated min budget of the optimizer rewrite against the real program with SGD (2 %);
* micro-batches: `alloctune plan` over the recordings at three batch sizes without accumulation,
  under the cap the GPU search used, against the real largest micro-batch (with accumulation);
  with `--confirm DIR`, also the answer of `plan --confirm` on the GPU (DIR/MODEL.json: plan's JSON
  with its `confirmations`, the accumulating program run at the predicted micro-batch).

* `tune` where no setting fits (`--tune DIR`: the `train-confirm` job's NAME.tune.json): its runs,
  the first remedy it names and whether a GPU run confirmed it, and the growing line it names.

    python bench/train_remedies.py --truth DIR [--batch-law DIR2] [--confirm DIR3] [--tune DIR4]

Prints a table and appends it, dated and with the command, to bench/results/train_remedies.md;
one line per program to bench/results/LOG.md.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from alloctune.analysis.core import analyse  # noqa: E402
from alloctune.analysis.phases import phase_at  # noqa: E402
from alloctune.analysis.repeats import live_before  # noqa: E402
from alloctune.explain.core import explain_trace  # noqa: E402
from alloctune.remedy.model import min_budget  # noqa: E402
from alloctune.remedy.training import checkpointing_remedy, optimizer_remedies  # noqa: E402
from alloctune.sim.replay import replay  # noqa: E402
from alloctune.trace import load_trace  # noqa: E402
from runlog import command, log_result  # noqa: E402

MODELS = {"bert": 32, "encoder": 32, "vit": 64}


def pct(got: int | None, want: int | None) -> str:
    if got is None or want is None:
        return "-"
    return f"{100.0 * (got - want) / want:+.2f} %"


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def peak_phase(facts: dict) -> str:
    """The phase the process measured its peak allocated in (the mark names the phase that just ended)."""
    row = max(facts["phases"], key=lambda r: r["peak_allocated"])
    return row["phase"]


def check_program(rec: Path, name: str, truth: dict[str, dict], confirm_dir: Path | None = None) -> dict:
    trace = load_trace(rec / f"{name}_base.pickle.xz")
    facts = json.loads((rec / f"{name}_base.facts.json").read_text())
    an = analyse(trace)
    ex = explain_trace(trace, analysis=an)
    phases_sum = sum(p.bytes for p in ex.phases)
    r = replay(trace, None)
    lb = live_before(trace.requests)
    top = max(range(len(lb)), key=lambda i: lb[i]) - 1  # after the request that made the most live bytes
    row = {
        "program": name,
        "phases_conserve": phases_sum == ex.moment["allocated"],
        "peak_allocated_sim": r.peak_allocated, "peak_allocated_facts": facts["peak_allocated"],
        "peak_phase": phase_at(trace.requests, an.phase_of or [], top), "peak_phase_facts": peak_phase(facts),
        "model_state": ex.category("model_state"), "param_bytes": facts["param_bytes"] + facts["buffer_bytes"],
        "optimizer_state": ex.category("optimizer_state"), "optimizer_state_facts": facts["optimizer_state_bytes"],
    }
    base = min_budget(trace, "", trace)
    row["min_budget_sim"], row["min_budget_real"] = base, truth.get(f"{name}_base", {}).get("min_budget")
    ck = checkpointing_remedy(an, base, "")
    row["ckpt_sim"] = ck.min_budget if ck is not None else None
    row["ckpt_real"] = truth.get(f"{name}_ckpt", {}).get("min_budget")
    ck_rec = rec / f"{name}_ckpt.pickle.xz"
    if ck_rec.exists():
        t = load_trace(ck_rec)
        row["ckpt_recording_sim"] = min_budget(t, "", t)
    opt = {o.name: o for o in optimizer_remedies(an, base, "")}
    row["sgd_sim"] = opt["optimizer_sgd"].min_budget if "optimizer_sgd" in opt else None
    row["sgd_real"] = truth.get(f"{name}_sgd", {}).get("min_budget")
    row["adamw8bit_sim"] = opt["optimizer_8bit"].min_budget if "optimizer_8bit" in opt else None
    mb = truth.get(f"micro:{name}")
    if mb and mb.get("cap"):
        b = MODELS[name]
        # the batch-size law: the program at smaller batches without accumulation (--batch-law), one structure
        # at every size; else the micro-batched recordings (more passes per step at smaller sizes)
        kind = "b" if (rec / f"{name}_b{b // 4}.pickle.xz").exists() else "mb"
        specs = [f"{rec / f'{name}_{kind}{b // 4}.pickle.xz'}:{b // 4}",
                 f"{rec / f'{name}_{kind}{b // 2}.pickle.xz'}:{b // 2}", f"{rec / f'{name}_base.pickle.xz'}:{b}"]
        p = subprocess.run([sys.executable, "-m", "alloctune", "plan", *specs, "--budget", f"{mb['cap']}B", "--max-size",
                            str(b), "--json"], capture_output=True, text=True, cwd=ROOT)
        try:
            largest = json.loads(p.stdout)["settings"][0]["largest"][0]["largest"] or "none"
        except (ValueError, KeyError, IndexError, TypeError):
            largest = f"plan failed: {p.stderr.strip()[-200:]}"
        row["micro_plan"], row["micro_real"] = largest, mb.get("largest_ok")
        row["micro_confirmed"] = confirmed_micro(confirm_dir, name)
    return row


def confirmed_micro(folder: Path | None, name: str) -> str:
    """`plan --confirm`'s answer for this model (DIR/NAME.json), with its GPU runs, or '-'."""
    f = folder / f"{name}.json" if folder is not None else None
    if f is None or not f.exists():
        return "-"
    try:
        c = json.loads(f.read_text())["confirmations"][0]
    except (ValueError, KeyError, IndexError):
        return "unreadable"
    runs = ", ".join(f"{r['size']} {r['outcome']}" for r in c["runs"])
    return f"{c['confirmed'] or 'none'} ({runs})"


def tune_rows(folder: Path) -> list[str]:
    """One table row per `alloctune tune` JSON in `folder` (NAME.tune.json)."""
    rows = ["| tune | budget | runs (setting @ budget -> outcome, peak reserved) | first next step | leak named |",
            "|---|---|---|---|---|"]
    for f in sorted(folder.glob("*.tune.json")):
        d = json.loads(f.read_text())
        runs = "; ".join(f"{t['conf'] or '(default)'}{' +checkpointing' if t.get('checkpointing') else ''} @ "
                         f"{mib(t['budget']) if t['budget'] else 'none'} -> {t['outcome']}, {mib(t['peak_reserved'])}"
                         for t in d["trials"])
        steps = (d.get("shortfall") or {}).get("next_steps") or []
        leak = next((m.group(1) for s in steps if "growing site" in s
                     if (m := re.search(r": at (\S+:\d+ \(\w+\))", s))), "-")
        rows.append(f"| {f.name.removesuffix('.tune.json')} | {mib(d['budget'])} MiB | {runs} | "
                    f"{(steps[0] if steps else '-')[:110]} | {leak} |")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--truth", required=True, help="the train job's output folder (truth.jsonl, rec.tar.xz)")
    ap.add_argument("--batch-law", default=None,
                    help="the output folder of `BATCH_SIZES=... bench/gpu.py train` (rec.tar.xz): micro-batches are "
                         "planned from those recordings")
    ap.add_argument("--confirm", default=None,
                    help="a folder of `plan --confirm` JSON per model (NAME.json): the micro-batch confirmed on the GPU")
    ap.add_argument("--tune", default=None, help="a folder of `alloctune tune --json` outputs (NAME.tune.json)")
    a = ap.parse_args()
    src = Path(a.truth)
    truth: dict[str, dict] = {}
    for line in (src / "truth.jsonl").read_text().splitlines():
        d = json.loads(line)
        key = d["name"] if d["kind"] != "micro_batch" else f"micro:{d['name']}"
        truth[key] = d
    with tempfile.TemporaryDirectory() as tmp:
        for folder in [src] + ([Path(a.batch_law)] if a.batch_law else []):
            with tarfile.open(folder / "rec.tar.xz") as tar:
                tar.extractall(tmp, filter="data")
        rec = Path(tmp) / "rec"
        confirm_dir = Path(a.confirm) if a.confirm else None
        rows = [check_program(rec, m, truth, confirm_dir) for m in MODELS if (rec / f"{m}_base.pickle.xz").exists()]
    lines = ["| program | phases sum = allocated | peak allocated sim / process | peak phase (explain / process) | "
             "optimizer state (explain / tensors) | min budget sim / real (MiB) | checkpointing sim / real (MiB) | "
             "SGD sim / real (MiB) | 8-bit AdamW sim (MiB) | largest micro-batch plan / real | plan --confirm (GPU runs) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['program']} | {r['phases_conserve']} | {r['peak_allocated_sim']} / {r['peak_allocated_facts']} | "
            f"{r['peak_phase']} / {r['peak_phase_facts']} | {r['optimizer_state']} / {r['optimizer_state_facts']} | "
            f"{mib(r['min_budget_sim'])} / {mib(r['min_budget_real'])} ({pct(r['min_budget_sim'], r['min_budget_real'])}) | "
            f"{mib(r['ckpt_sim'])} / {mib(r['ckpt_real'])} ({pct(r['ckpt_sim'], r['ckpt_real'])}) | "
            f"{mib(r['sgd_sim'])} / {mib(r['sgd_real'])} ({pct(r['sgd_sim'], r['sgd_real'])}) | {mib(r['adamw8bit_sim'])} | "
            f"{r.get('micro_plan', '-')} / {r.get('micro_real', '-')} | {r.get('micro_confirmed', '-')} |")
    if a.tune:
        lines += ["", *tune_rows(Path(a.tune))]
    print("\n".join(lines))
    import datetime as dt

    out = ROOT / "bench" / "results" / "train_remedies.md"
    head = "" if out.exists() else "# Training remedies against the GPU's ground truth (issue #36)\n"
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with open(out, "a") as f:
        f.write(f"{head}\n## {stamp}\n\n`{command()}`\n\n" + "\n".join(lines) + "\n")
    for r in rows:
        log_result(f"{r['program']}: checkpointing sim {pct(r['ckpt_sim'], r['ckpt_real'])} vs real, SGD sim "
                   f"{pct(r['sgd_sim'], r['sgd_real'])}, micro-batch plan {r.get('micro_plan')} real {r.get('micro_real')}, "
                   f"plan --confirm {r.get('micro_confirmed')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
