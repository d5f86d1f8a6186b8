"""Independent ground truth for `tune`: each standard setting's smallest working cap, both ends tested.

Why a new bisection: the one in `gpu_recordings.py bisect` assumed its lower end (0.97 × peak
allocated) fails and never ran it, so on convolution workloads (which adapt under a cap) its
answer was only an upper bound. Here every bracket end is a run:

* opening round: caps at 0.70, 0.85, 1.00 and 1.15 × a prior P (the earlier bisection's
  tested pass for this workload and setting, else the default's), widened by ×0.6 downwards
  while the lowest passes and by ×1.3 upwards while the highest fails;
* then rounds of three caps side by side, each splitting the bracket in four, until the
  tested pass and the tested failure are within 1 % of the pass (two rounds from the
  opening grid, up to four after a widening).

Fresh processes (`bench/capwrap.py`: the cap by `set_per_process_memory_fraction`, the bench's
own code, not alloctune's agent), everything side by side on one GPU under a memory claim
(`gpu_recordings.Pool`). Results are appended to `truth.jsonl` as each setting finishes, so a run
cut off by its time limit keeps what finished. Optionally the tunes of `gpu_tune_real.py` run
beside it (`--tunes`), on the same commands.

    python bench/gpu_truth.py --out $OUT --jobs 10 --deadline 540 --tunes hubert,timm,torchvision,llama,rvc,diffusion
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_recordings as ga  # noqa: E402

STANDARD = {
    "default": "",
    "expandable": "expandable_segments:True",
    "max_split_128": "max_split_size_mb:128",
    "max_split_256": "max_split_size_mb:256",
    "max_split_512": "max_split_size_mb:512",
    "gc_split_256": "garbage_collection_threshold:0.6,max_split_size_mb:256",
    "roundup_4": "roundup_power2_divisions:4",
}
TARGETS = {**ga.REAL, **ga.OWN}
PRIOR = HERE / "gpu-results" / "batch8" / "b" / "bisect_results.json"
ALIGN = 2 << 20
LOCK = threading.Lock()


def _align(n: int) -> int:
    return max(ALIGN, n // ALIGN * ALIGN)


def priors() -> dict[str, int]:
    """The earlier bisection's tested passes by "{workload}_{setting}" (a starting point only)."""
    try:
        rows = json.loads(PRIOR.read_text())
    except (OSError, ValueError):
        return {}
    return {r["name"]: r["min_budget"] for r in rows if r.get("min_budget")}


def truth(pool: ga.Pool, out: Path, workload: str, setting: str, prior: int) -> dict:
    target, conf = TARGETS[workload], STANDARD[setting]
    runs: list[dict] = []
    name = f"{workload}_{setting}"

    def probe(caps: list[int]) -> dict[int, bool | None]:
        caps = sorted(set(caps))
        with ThreadPoolExecutor(len(caps)) as ex:
            res = list(ex.map(lambda c: pool.run(out / "runs" / f"{name}_{c >> 20}", target, conf, cap=c), caps))
        seen = {}
        for c, r in zip(caps, res):
            ok = None if r is None else r["outcome"] == "ok"
            if r is not None and r["outcome"] not in ("ok", "oom"):
                ok = None  # a crash or error is no evidence either way
            runs.append({"cap": c, "outcome": None if r is None else r["outcome"],
                         "num_ooms": None if r is None else r["stats"].get("num_ooms")})
            seen[c] = ok
        return seen

    passed: int | None = None
    failed: int | None = None

    def take(seen: dict[int, bool | None]) -> None:
        nonlocal passed, failed
        for c, ok in seen.items():
            if ok is True:
                passed = c if passed is None else min(passed, c)
            elif ok is False:
                failed = c if failed is None else max(failed, c)

    take(probe([_align(int(prior * f)) for f in (0.70, 0.85, 1.00, 1.15)]))
    lo_f, hi_f = 0.70, 1.15
    while passed is not None and failed is None and lo_f > 0.05:  # everything passed: lower
        lo_f *= 0.6
        take(probe([_align(int(prior * lo_f))]))
    while passed is None and hi_f < 4 and (failed is not None or not runs or runs[-1]["outcome"] is not None):
        hi_f *= 1.3  # everything failed: higher
        take(probe([_align(int(prior * hi_f))]))
    for _ in range(4):  # two rounds from the opening grid; more only after a widening
        if passed is None or failed is None or passed - failed <= max(ALIGN, passed // 100):
            break
        step = (passed - failed) / 4
        caps = [_align(int(failed + step * k)) for k in (1, 2, 3)]
        caps = [c for c in caps if failed < c < passed]
        if not caps:
            break
        take(probe(caps))
    row = {"workload": workload, "setting": setting, "conf": conf, "command": target, "prior": prior,
           "min_budget": passed, "fails_at": failed, "runs": runs}
    with LOCK, (out / "truth.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps({k: v for k, v in row.items() if k not in ("runs", "command")}), flush=True)
    from runlog import log_result  # bench/ is on sys.path (gpu_recordings is imported from there too)

    log_result(f"{workload} {setting}: min budget {passed} B, fails at {failed} B ({len(runs)} runs)", folder=out)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ga.pool_options(ap, jobs=10, deadline=540)
    ap.add_argument("--workloads", default=",".join(TARGETS))
    ap.add_argument("--settings", default=",".join(STANDARD))
    ap.add_argument("--tunes", default="", help="also run gpu_tune_real.py's tunes for these workloads, side by side")
    ap.add_argument("--skip-done", type=Path, default=None, help="a truth.jsonl whose rows are not measured again")
    a = ap.parse_args(argv)
    out, pool = ga.open_pool(a)
    (out / "runs").mkdir(exist_ok=True)
    done = set()
    if a.skip_done and a.skip_done.exists():
        done = {(r["workload"], r["setting"]) for r in map(json.loads, a.skip_done.read_text().splitlines())
                if r.get("min_budget") and r.get("fails_at")
                and r["min_budget"] - r["fails_at"] <= max(ALIGN, r["min_budget"] // 100)}
    prior = priors()
    tunes = None
    if a.tunes:
        import gpu_tune_real as gt

        tunes = threading.Thread(target=gt.main, args=(["--out", str(out / "tune"), "--only", a.tunes,
                                                         "--timeout", str(a.deadline - 30)],), daemon=True)
        tunes.start()
    # settings in order of importance, so a deadline cuts the least useful ones
    tasks = [(w, s) for s in a.settings.split(",") for w in a.workloads.split(",") if (w, s) not in done]
    with ThreadPoolExecutor(max(2, a.jobs // 2)) as ex:  # a few settings at a time, in order
        futs = [ex.submit(truth, pool, out, w, s, prior.get(f"{w}_{s}") or prior.get(f"{w}_default") or (1 << 30))
                for w, s in tasks]
        for f in futs:
            try:
                f.result()
            except Exception as exc:  # noqa: BLE001 - one setting's failure must not lose the others
                print(f"truth: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    if tunes is not None:
        tunes.join(timeout=max(1.0, a.deadline - (time.monotonic() - ga.T0)))
    print(f"truth done in {time.monotonic() - ga.T0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
