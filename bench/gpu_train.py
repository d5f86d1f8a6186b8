"""Training remedies' ground truth on the GPU (job `train` of bench/gpu.py).

Stage 1, recordings (uncapped, Python stacks, the process's own facts beside each): the three
programs of bench/train_programs.py as written, with checkpointing, with SGD, and at two
micro-batch sizes; a leaking loop. Stage 2, real min budgets by fresh-process bisection of the
program as written and with each remedy written by hand. Stage 3, the largest micro-batch that
completes under a budget (3/4 of the program's own min budget), by bisection on the micro-batch.
Results go to `OUT/truth.jsonl` as they come; the recordings are packed into `OUT/rec.tar.xz`.

    python bench/gpu_train.py --out $OUT/train --jobs 8 --deadline 500 [--only bert,encoder]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_recordings as gr  # noqa: E402

PROG = "bench/train_programs.py"
MODELS = {"bert": 32, "encoder": 32, "vit": 64}  # model -> batch
VARIANTS = {"base": [], "ckpt": ["--checkpointing"], "sgd": ["--optimizer", "sgd"]}
LOCK = threading.Lock()


def target(model: str, extra: list[str], facts: Path | None = None) -> list[str]:
    return [PROG, model, *extra] + (["--facts", str(facts)] if facts else [])


def log(out: Path, row: dict) -> None:
    with LOCK, open(out / "truth.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)


def record(pool: gr.Pool, rec: Path, name: str, model: str, extra: list[str]) -> dict | None:
    return pool.run(rec / name, target(model, extra, rec / f"{name}.facts.json"), "", record=True,
                    claim=14 << 30)


def largest_micro(pool: gr.Pool, work: Path, model: str, batch: int, cap: int) -> dict:
    lo, hi = 0, batch + 1  # lo passes (0: nothing known), hi fails
    runs = []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        r = pool.run(work / "runs" / f"{model}_mb{mid}", target(model, ["--micro-batch", str(mid)]), "", cap=cap)
        if r is None:
            return {"kind": "micro_batch", "name": model, "cap": cap, "largest_ok": None, "runs": runs}
        runs.append({"micro_batch": mid, "outcome": r["outcome"]})
        if r["outcome"] == "ok":
            lo = mid
        else:
            hi = mid
    return {"kind": "micro_batch", "name": model, "cap": cap, "batch": batch, "largest_ok": lo, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser()
    gr.pool_options(ap, jobs=8, deadline=500)
    ap.add_argument("--only", default=",".join(MODELS))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-sizes", default="",
                    help="only record each program at these batch sizes, no accumulation (comma list; names {m}_b{n}): "
                         "the batch-size law that plans the largest micro-batch")
    a = ap.parse_args()
    out, pool = gr.open_pool(a)
    import torch

    gr.GPU_MEM = torch.cuda.get_device_properties(0).total_memory - (6 << 30)
    models = [m for m in a.only.split(",") if m]
    # recordings and bisection runs in a scratch folder: only truth.jsonl, rec.tar.xz and the logs go to OUT
    # (a device call brings back a few files, not hundreds)
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="gpu-train-"))
    rec = work / "rec"
    rec.mkdir()
    (work / "runs").mkdir()
    jobs = []
    for m in models:
        if a.batch_sizes:
            jobs += [(f"{m}_b{n}", m, ["--batch", n]) for n in a.batch_sizes.split(",")]
            continue
        for v, extra in VARIANTS.items():
            jobs.append((f"{m}_{v}", m, extra))
        b = MODELS[m]
        for mb in (b // 4, b // 2):
            jobs.append((f"{m}_mb{mb}", m, ["--micro-batch", str(mb)]))
    if not a.batch_sizes:
        jobs.append(("bert_leak", "bert", ["--keep-logits", "--steps", "6"]))
    with ThreadPoolExecutor(len(jobs)) as ex:
        side = dict(zip([j[0] for j in jobs], ex.map(lambda j: record(pool, rec, *j), jobs)))
    for name, r in side.items():
        log(out, {"kind": "recording", "name": name, "outcome": r and r["outcome"], "stats": r and r["stats"]})
    with tarfile.open(out / "rec.tar.xz", "w:xz") as tar:
        tar.add(rec, arcname="rec")
    print(f"recordings done at {time.monotonic() - gr.T0:.0f}s", flush=True)
    if a.batch_sizes:
        return

    def budget_task(name: str) -> dict:
        r = side.get(name)
        m, v = name.split("_", 1)
        if not r or r["outcome"] != "ok":
            return {"kind": "min_budget", "name": name, "min_budget": None, "error": "no recording"}
        st = r["stats"]
        lo = int(st["allocated_bytes.all.peak"] * 0.95)
        hi = int(st["reserved_bytes.all.peak"] * 1.02) + (32 << 20)
        res = {"kind": "min_budget", **gr.bisect_budget(pool, work / "runs", name, target(m, VARIANTS[v]), "", lo, hi,
                                                        a.steps)}
        log(out, res)
        return res

    with ThreadPoolExecutor(16) as ex:
        budgets = {n: r for n, r in zip(
            [f"{m}_{v}" for m in models for v in VARIANTS],
            ex.map(budget_task, [f"{m}_{v}" for m in models for v in VARIANTS]))}
    print(f"bisections done at {time.monotonic() - gr.T0:.0f}s", flush=True)

    def micro_task(m: str) -> dict:
        base = budgets.get(f"{m}_base", {}).get("min_budget")
        if not base:
            return {}
        res = largest_micro(pool, work, m, MODELS[m], int(base * 0.75))
        log(out, res)
        return res

    with ThreadPoolExecutor(len(models)) as ex:
        list(ex.map(micro_task, models))
    subprocess.run(["rm", "-rf", str(work)])
    print(f"done at {time.monotonic() - gr.T0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
