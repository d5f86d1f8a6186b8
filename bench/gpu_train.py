"""Training remedies (#36): their ground truth on the GPU, and alloctune's answers against it on a CPU.

    python bench/gpu_train.py --out DIR [--jobs 8] [--deadline 500] [--only bert,encoder] [--batch-sizes 8,16]
    python bench/gpu_train.py score --truth DIR [--batch-law DIR2] [--confirm DIR3] [--tune DIR4]

GPU (job `train` of bench/gpu.py), on the programs of bench/train_programs.py: (1) recordings (uncapped,
Python stacks, the process's own facts beside each) of each program as written, with checkpointing, with
SGD and at two micro-batch sizes, and of a leaking loop; (2) real min budgets by fresh-process bisection of
the program as written and with each remedy written by hand; (3) the largest micro-batch that completes
under 3/4 of the program's own min budget, by bisection on the micro-batch. Results go to `DIR/truth.jsonl`
as they come; the recordings are packed into `DIR/rec.tar.xz`. `--batch-sizes`: only record each program at
those batch sizes without accumulation (the batch-size law that plans the largest micro-batch).

score (CPU), per program: phases (the live bytes by phase sum exactly to allocated; the simulated peak
allocated equals the process's; the phase of the peak is the one the process measured it in); model and
optimizer state against the tensors' own bytes; checkpointing and SGD: the simulated min budget of the
rewritten recording against the real program with the remedy written by hand; micro-batches: `alloctune
plan` over recordings at three batch sizes under the cap the GPU search used, against the real largest
micro-batch (`--batch-law`: the `BATCH_SIZES=... bench/gpu.py train` output; `--confirm DIR`: plan
--confirm's JSON per model, DIR/MODEL.json); `--tune DIR`: the `train-confirm` job's NAME.tune.json (its
runs, the first remedy it names, the growing line it names). Appends the table, dated and with the command,
to bench/results/train_remedies.md; one line per program to bench/results/LOG.md.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runlog import append_section, command, log_result, md_table
from suite import ROOT, T0, alloctune, bisect_budget, open_pool, pool_options

PROG = "bench/train_programs.py"
MODELS = {"bert": 32, "encoder": 32, "vit": 64}  # model -> batch
VARIANTS = {"base": [], "ckpt": ["--checkpointing"], "sgd": ["--optimizer", "sgd"]}
LOCK = threading.Lock()


def target(model: str, extra: list[str], facts: Path | None = None) -> list[str]:
    return [PROG, model, *extra] + (["--facts", str(facts)] if facts else [])


# ---- on the GPU ---------------------------------------------------------------------------------------
def log(out: Path, row: dict) -> None:
    with LOCK, open(out / "truth.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)


def largest_micro(pool, work: Path, model: str, batch: int, cap: int) -> dict:
    lo, hi = 0, batch + 1  # lo passes (0: nothing known), hi fails
    runs = []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        r = pool.run(work / "runs" / f"{model}_mb{mid}", target(model, ["--micro-batch", str(mid)]), "", cap=cap)
        if r is None:
            return {"kind": "micro_batch", "name": model, "cap": cap, "largest_ok": None, "runs": runs}
        runs.append({"micro_batch": mid, "outcome": r["outcome"]})
        lo, hi = (mid, hi) if r["outcome"] == "ok" else (lo, mid)
    return {"kind": "micro_batch", "name": model, "cap": cap, "batch": batch, "largest_ok": lo, "runs": runs}


def gpu(a: argparse.Namespace) -> int:
    import torch

    out, pool = open_pool(a, gpu_mem=torch.cuda.get_device_properties(0).total_memory - (6 << 30))
    models = [m for m in a.only.split(",") if m]
    # recordings and bisection runs in a scratch folder: only truth.jsonl, rec.tar.xz and the logs go to OUT
    # (a device call brings back a few files, not hundreds)
    work = Path(tempfile.mkdtemp(prefix="gpu-train-"))
    rec = work / "rec"
    rec.mkdir()
    (work / "runs").mkdir()
    jobs = []
    for m in models:
        if a.batch_sizes:
            jobs += [(f"{m}_b{n}", m, ["--batch", n]) for n in a.batch_sizes.split(",")]
            continue
        jobs += [(f"{m}_{v}", m, extra) for v, extra in VARIANTS.items()]
        jobs += [(f"{m}_mb{mb}", m, ["--micro-batch", str(mb)]) for mb in (MODELS[m] // 4, MODELS[m] // 2)]
    if not a.batch_sizes:
        jobs.append(("bert_leak", "bert", ["--keep-logits", "--steps", "6"]))
    with ThreadPoolExecutor(len(jobs)) as ex:
        side = dict(zip([j[0] for j in jobs], ex.map(lambda j: pool.run(
            rec / j[0], target(j[1], j[2], rec / f"{j[0]}.facts.json"), "", record=True, claim=14 << 30), jobs)))
    for name, r in side.items():
        log(out, {"kind": "recording", "name": name, "outcome": r and r["outcome"], "stats": r and r["stats"]})
    with tarfile.open(out / "rec.tar.xz", "w:xz") as tar:
        tar.add(rec, arcname="rec")
    print(f"recordings done at {time.monotonic() - T0:.0f}s", flush=True)
    if a.batch_sizes:
        return 0

    def budget_task(name: str) -> dict:
        r = side.get(name)
        m, v = name.split("_", 1)
        if not r or r["outcome"] != "ok":
            return {"kind": "min_budget", "name": name, "min_budget": None, "error": "no recording"}
        st = r["stats"]
        lo, hi = int(st["allocated_bytes.all.peak"] * 0.95), int(st["reserved_bytes.all.peak"] * 1.02) + (32 << 20)
        res = {"kind": "min_budget", **bisect_budget(pool, work / "runs", name, target(m, VARIANTS[v]), "", lo, hi, a.steps)}
        log(out, res)
        return res

    names = [f"{m}_{v}" for m in models for v in VARIANTS]
    with ThreadPoolExecutor(16) as ex:
        budgets = dict(zip(names, ex.map(budget_task, names)))
    print(f"bisections done at {time.monotonic() - T0:.0f}s", flush=True)

    def micro_task(m: str) -> dict:
        base = budgets.get(f"{m}_base", {}).get("min_budget")
        if not base:
            return {}
        res = largest_micro(pool, work, m, MODELS[m], int(base * 0.75))
        log(out, res)
        return res

    with ThreadPoolExecutor(len(models)) as ex:
        list(ex.map(micro_task, models))
    shutil.rmtree(work, ignore_errors=True)
    print(f"done at {time.monotonic() - T0:.0f}s", flush=True)
    return 0


# ---- on a CPU: alloctune against the GPU's truth ---------------------------------------------------------
def pct(got: int | None, want: int | None) -> str:
    return "-" if got is None or want is None else f"{100.0 * (got - want) / want:+.2f} %"


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def check_program(rec: Path, name: str, truth: dict[str, dict], confirm_dir: Path | None = None) -> dict:
    from alloctune.analysis.core import analyse
    from alloctune.analysis.phases import phase_at
    from alloctune.analysis.repeats import live_before
    from alloctune.explain.core import explain_trace
    from alloctune.remedy.model import min_budget
    from alloctune.remedy.training import checkpointing_remedy, optimizer_remedies
    from alloctune.sim.replay import replay
    from alloctune.trace import load_trace

    trace = load_trace(rec / f"{name}_base.pickle.xz")
    facts = json.loads((rec / f"{name}_base.facts.json").read_text())
    an = analyse(trace)
    ex = explain_trace(trace, analysis=an)
    lb = live_before(trace.requests)
    top = max(range(len(lb)), key=lambda i: lb[i]) - 1  # after the request that made the most live bytes
    row = {
        "program": name, "phases_conserve": sum(p.bytes for p in ex.phases) == ex.moment["allocated"],
        "peak_allocated_sim": replay(trace, None).peak_allocated, "peak_allocated_facts": facts["peak_allocated"],
        # the phase the process measured its peak allocated in (the mark names the phase that just ended)
        "peak_phase": phase_at(trace.requests, an.phase_of or [], top),
        "peak_phase_facts": max(facts["phases"], key=lambda r: r["peak_allocated"])["phase"],
        "model_state": ex.category("model_state"), "param_bytes": facts["param_bytes"] + facts["buffer_bytes"],
        "optimizer_state": ex.category("optimizer_state"), "optimizer_state_facts": facts["optimizer_state_bytes"],
    }
    base = min_budget(trace, "", trace)
    row["min_budget_sim"], row["min_budget_real"] = base, truth.get(f"{name}_base", {}).get("min_budget")
    ck = checkpointing_remedy(an, base, "")
    row["ckpt_sim"] = ck.min_budget if ck is not None else None
    row["ckpt_real"] = truth.get(f"{name}_ckpt", {}).get("min_budget")
    if (rec / f"{name}_ckpt.pickle.xz").exists():
        t = load_trace(rec / f"{name}_ckpt.pickle.xz")
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
        p = alloctune("plan", *specs, "--budget", f"{mb['cap']}B", "--max-size", str(b), "--json")
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
    rows = []
    for f in sorted(folder.glob("*.tune.json")):
        d = json.loads(f.read_text())
        runs = "; ".join(f"{t['conf'] or '(default)'}{' +checkpointing' if t.get('checkpointing') else ''} @ "
                         f"{mib(t['budget']) if t['budget'] else 'none'} -> {t['outcome']}, {mib(t['peak_reserved'])}"
                         for t in d["trials"])
        steps = (d.get("shortfall") or {}).get("next_steps") or []
        leak = next((m.group(1) for s in steps if "growing site" in s
                     if (m := re.search(r": at (\S+:\d+ \(\w+\))", s))), "-")
        rows.append((f.name.removesuffix(".tune.json"), f"{mib(d['budget'])} MiB", runs,
                     (steps[0] if steps else "-")[:110], leak))
    return md_table(("tune", "budget", "runs (setting @ budget -> outcome, peak reserved)", "first next step",
                     "leak named"), rows).splitlines()


def score(a: argparse.Namespace) -> int:
    src = Path(a.truth)
    truth: dict[str, dict] = {}
    for line in (src / "truth.jsonl").read_text().splitlines():
        d = json.loads(line)
        truth[d["name"] if d["kind"] != "micro_batch" else f"micro:{d['name']}"] = d
    with tempfile.TemporaryDirectory() as tmp:
        for folder in [src] + ([Path(a.batch_law)] if a.batch_law else []):
            with tarfile.open(folder / "rec.tar.xz") as tar:
                tar.extractall(tmp, filter="data")
        rec = Path(tmp) / "rec"
        confirm_dir = Path(a.confirm) if a.confirm else None
        rows = [check_program(rec, m, truth, confirm_dir) for m in MODELS if (rec / f"{m}_base.pickle.xz").exists()]
    head = ("program", "phases sum = allocated", "peak allocated sim / process", "peak phase (explain / process)",
            "optimizer state (explain / tensors)", "min budget sim / real (MiB)", "checkpointing sim / real (MiB)",
            "SGD sim / real (MiB)", "8-bit AdamW sim (MiB)", "largest micro-batch plan / real", "plan --confirm (GPU runs)")
    lines = [md_table(head, [(
        r["program"], r["phases_conserve"], f"{r['peak_allocated_sim']} / {r['peak_allocated_facts']}",
        f"{r['peak_phase']} / {r['peak_phase_facts']}", f"{r['optimizer_state']} / {r['optimizer_state_facts']}",
        f"{mib(r['min_budget_sim'])} / {mib(r['min_budget_real'])} ({pct(r['min_budget_sim'], r['min_budget_real'])})",
        f"{mib(r['ckpt_sim'])} / {mib(r['ckpt_real'])} ({pct(r['ckpt_sim'], r['ckpt_real'])})",
        f"{mib(r['sgd_sim'])} / {mib(r['sgd_real'])} ({pct(r['sgd_sim'], r['sgd_real'])})", mib(r["adamw8bit_sim"]),
        f"{r.get('micro_plan', '-')} / {r.get('micro_real', '-')}", r.get("micro_confirmed", "-")) for r in rows])]
    if a.tune:
        lines += ["", *tune_rows(Path(a.tune))]
    print("\n".join(lines))
    append_section(ROOT / "bench" / "results" / "train_remedies.md",
                   "Training remedies against the GPU's ground truth (issue #36)", f"`{command()}`", "\n".join(lines))
    for r in rows:
        log_result(f"{r['program']}: checkpointing sim {pct(r['ckpt_sim'], r['ckpt_real'])} vs real, SGD sim "
                   f"{pct(r['sgd_sim'], r['sgd_real'])}, micro-batch plan {r.get('micro_plan')} real {r.get('micro_real')}, "
                   f"plan --confirm {r.get('micro_confirmed')}", bench="train_remedies")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    scoring = bool(argv) and argv[0] == "score"
    ap = argparse.ArgumentParser(prog="gpu_train.py" + (" score" if scoring else ""), description=__doc__.splitlines()[0])
    if scoring:
        ap.add_argument("--truth", required=True, help="the train job's output folder (truth.jsonl, rec.tar.xz)")
        ap.add_argument("--batch-law", default=None, help="the output folder of `BATCH_SIZES=... bench/gpu.py train`")
        ap.add_argument("--confirm", default=None, help="a folder of `plan --confirm` JSON per model (NAME.json)")
        ap.add_argument("--tune", default=None, help="a folder of `alloctune tune --json` outputs (NAME.tune.json)")
        return score(ap.parse_args(argv[1:]))
    pool_options(ap, jobs=8, deadline=500)
    ap.add_argument("--only", default=",".join(MODELS))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-sizes", default="", help="only record each program at these batch sizes, no accumulation "
                    "(comma list; names {m}_b{n}): the batch-size law that plans the largest micro-batch")
    return gpu(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
