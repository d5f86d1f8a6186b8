"""Program-level remedies (#29): what each really saves on the GPU, and alloctune's answers against it on a CPU.

    python bench/gpu_remedies.py --out DIR [--jobs 8] [--deadline 520] [--only P,...] [--calibrate]   # GPU
    python bench/gpu_remedies.py real [--data tests/data/remedies_gpu] [--out bench/results/remedies_real.md]
    python bench/gpu_remedies.py offline [--traces ../shared/traces] [--out bench/results]
    python bench/gpu_remedies.py utilization [--workloads rvc,llm,diffusion,train] [--out FILE.md]

GPU (jobs `remedies`, `nograd-truth` of bench/gpu.py): (1) alloctune records the unchanged programs of
bench/cap_programs.py (agent, Python stacks): `hubert` (inference with autograd on), `seg` (DeepLabV3 at mixed
sizes, the cache fragments), `det`, `convnext` (timm ConvNeXt, cuDNN workspaces), and `hubert` once more with
the agent's `--no-grad` switch (the measured remedy); (2) every program and every variant remedied BY HAND
(`hubert_nograd`, `hubert_cublas`, `seg_ec`, `det_ec`, `convnext_bench`) runs uncapped (peaks) and has its
REAL min budget bisected (default setting, fresh processes, bench/capwrap.py). `--calibrate` (with the
recordings in --out): the same programs under caps between peak allocated and peak reserved, where cuDNN
falls back to smaller workspaces (what turns the conservative min budget into one number).

real (CPU, data tests/data/remedies_gpu/, real.json says how): for each row alloctune sees only the
unchanged program's recording (and, where the row says so, the agent's confirming run or its calibration
runs); the "real" columns are the hand-remedied programs. Min budget four ways, as cuDNN falls back under
a cap: conservative (every request fixed), learned (fallback ladders learned from the two calibration runs
and carried over to the other calls of the same site: trace/fallible.py `generalise`), deepest (every call
of a site allowed down as far as any call went) and optimistic (workspace-shaped requests fallible to 0).

offline (CPU): on the shared H200 recordings (RVC without `empty_cache()` under three settings; the Llama
`generate` run), the recording's own min budget, then each simulated remedy's (release points, the
Janitor's policies, workspace caps) with its saving, peak reserved, utilization, clean-ups and driver-call
bound; the truth column is the RVC program that called `empty_cache()` after every chunk (`rvc_ec1`).

utilization (CPU, #29.6): `explain`'s utilization table on the four H200 reference recordings
(src/alloctune/data/traces): the best row, whether it reaches 0.97, and what holds it back.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runlog import append_section, command, log_result, md_table
from suite import ROOT, SHARED, SHIPPED, T0, MiB, alloctune, bisect_budget, open_pool, pool_options

PROGRAMS = ["hubert", "hubert_nograd", "hubert_cublas", "seg", "seg_ec", "det", "det_ec", "convnext", "convnext_bench"]
RECORD = {"hubert": [], "hubert_nograd_agent": ["--no-grad"], "seg": [], "det": [], "convnext": []}
CALIBRATE = {"hubert_nograd_agent": ["--no-grad"], "seg": [], "det": [], "convnext": [], "hubert": []}
TOL = dict(rel_tol=0.002, abs_tol=1 << 20)


def mib(b: int | None, digits: int = 1) -> str:
    """MiB with `digits` decimals (0: rounded to a whole number, never '-0')."""
    return "-" if b is None else f"{round(b / MiB):d}" if digits == 0 else f"{b / MiB:.{digits}f}"


# ---- on the GPU ---------------------------------------------------------------------------------------
def record(out: Path, name: str, extra: list[str], budget: int = 0, tag: str = "") -> dict:
    prog = name.removesuffix("_agent").removesuffix("_nograd") if extra else name
    args = ["run", *extra, *(["--budget", f"{budget}B"] if budget else []), "--record",
            str(out / f"rec_{name}{tag}.pickle"), "--json", "--", sys.executable, "bench/cap_programs.py", prog]
    t = time.monotonic()
    p = alloctune(*args, timeout=300)
    (out / f"rec_{name}{tag}.log").write_text(p.stdout + "\n--- stderr\n" + p.stderr)
    return {"name": name + tag, "cmd": " ".join(["-m", "alloctune", *args]), "rc": p.returncode,
            "wall_s": round(time.monotonic() - t, 1)}


def trial(out: Path, name: str) -> dict | None:
    log = out / f"rec_{name}.log"
    try:
        return json.loads(log.read_text().split("\n--- stderr")[0]) if log.exists() else None
    except ValueError:
        return None


def gpu(a: argparse.Namespace) -> int:
    out, pool = open_pool(a)
    programs = a.only.split(",") if a.only else PROGRAMS
    # with --only, only the recordings of the programs named (hubert_nograd_agent goes with hubert_nograd)
    record_set = {n: x for n, x in RECORD.items() if not a.only or n.removesuffix("_agent") in programs}
    cal_jobs = []
    for name, extra in CALIBRATE.items():
        r = trial(out, name) if a.calibrate and (not a.only or name.removesuffix("_agent") in programs) else None
        if r and r.get("peak_allocated") and r.get("peak_reserved"):
            al, res = r["peak_allocated"], r["peak_reserved"]
            # mid: between the peaks; tight: just above peak allocated; low: just below it, where cuDNN must
            # fall back further than the tight run shows (the ladders below it are what a min budget needs)
            cal_jobs += [(name, extra, (al + res) // 2, "_cal_mid"), (name, extra, int(al * 1.04), "_cal_tight"),
                         (name, extra, int(al * 0.96), "_cal_low")]
    with ThreadPoolExecutor(len(programs) + len(record_set) + len(cal_jobs)) as ex:
        recs = [ex.submit(record, out, *j) for j in cal_jobs] if a.calibrate else [
            ex.submit(record, out, n, x) for n, x in record_set.items()]
        peaks = dict(zip(programs, ex.map(lambda p: pool.run(out / f"peak_{p}", ["bench/cap_programs.py", p], ""),
                                          programs)))
        recorded = [r.result() for r in recs]
    print(f"recordings and peaks done at {time.monotonic() - T0:.0f}s", flush=True)
    tasks = [(p, int(r["stats"]["allocated_bytes.all.peak"] * 0.97), int(r["stats"]["reserved_bytes.all.peak"] * 1.01))
             for p, r in peaks.items() if r and r["outcome"] == "ok"]
    with ThreadPoolExecutor(max(1, len(tasks))) as ex:
        bis = list(ex.map(lambda t: bisect_budget(pool, out, f"min_{t[0]}", ["bench/cap_programs.py", t[0]], "",
                                                  t[1], t[2], 10), tasks))
    result = {"recorded": recorded, "peaks": {p: (r or {}).get("stats") for p, r in peaks.items()},
              "min_budget": {b["name"][4:]: b for b in bis}}
    (out / ("remedies_cal.json" if a.calibrate else "remedies.json")).write_text(json.dumps(result, indent=1))
    for b in bis:
        print(json.dumps({k: v for k, v in b.items() if k != "runs"}), flush=True)
    print(f"remedies done in {time.monotonic() - T0:.0f}s", flush=True)
    return 0


# ---- real: alloctune's answers against the hand-remedied programs ---------------------------------------
def err(p: int | None, r: int | None) -> str:
    return "-" if p is None or not r else f"{100 * (p / r - 1):+.2f}%"


def budgets(data: Path, trace, cal: str | None) -> tuple[int, int | None, int | None, int, str]:
    """(conservative, learned from the calibration runs (generalised) or None, deepest or None, optimistic,
    what the learned model rests on)."""
    from alloctune.sim.budget import min_budget
    from alloctune.trace import load_trace
    from alloctune.trace.fallible import combine, generalise, learn_from_calibration, optimistic, with_fallbacks

    cons = min_budget(trace, None, **TOL).budget
    learned = deep = None
    note = ""
    model, taught = None, []
    for tag in ("mid", "tight", "low") if cal else ():
        f = data / f"{cal}_cal_{tag}.pickle.xz"
        if f.exists():
            m = learn_from_calibration(load_trace(data / f"{cal}.pickle.xz"), load_trace(f))
            model = m if model is None else combine(model, m)
            taught += [(tag, m.calibration_cap)] if m.ladders else []
    if model is not None and model.ladders:
        general = generalise(model, trace)
        learned = min_budget(with_fallbacks(trace, general), None, **TOL).budget
        info = general.to_dict().get("generalised")
        caps = [c for _, c in taught if c]
        note = (f"ladders learned for {len(model.ladders)} request size(s) (calibration run capped at "
                f"{', '.join(f'{t} {mib(c)} MiB' for t, c in taught)})"
                + (f"; {info['note']}" if info else "; none generalised"))
        if caps and abs(learned / min(caps) - 1) <= 0.02:  # the ladders that settled on a workspace end there
            note += ("; the learned answer lies at the calibration's cap: below it, the ladders that settled on a "
                     "workspace say nothing (a calibration capped lower would)")
        deep = min_budget(with_fallbacks(trace, generalise(model, trace, deepest=True)), None, **TOL).budget
    return cons, learned, deep, min_budget(optimistic(trace), None, **TOL).budget, note


def real_rows(data: Path) -> list[dict]:
    from alloctune.analysis.core import analyse
    from alloctune.remedy.release import repetition_ends, with_empty_cache
    from alloctune.sim.replay import replay
    from alloctune.trace import load_trace

    real = json.loads((data / "real.json").read_text())
    rmin, rpeak = real["min_budget"], real["peaks"]
    out = []

    def add(program, remedy, how, trace, cal, real_name):
        cons, learned, deep, opt, note = budgets(data, trace, cal)
        out.append(dict(program=program, remedy=remedy, how=how, cons=cons, learned=learned, deep=deep, opt=opt,
                        peak=replay(trace, None).peak_reserved, note=note,
                        real_min=rmin.get(real_name, {}).get("min_budget"), real_peak=rpeak.get(real_name, {}).get("reserved")))

    seg, hub, det = (load_trace(data / f"{n}.pickle.xz") for n in ("seg", "hubert", "det"))
    add("seg", "none", "replay of the recording", seg, "seg", "seg")
    add("seg", "empty_cache() after every image", "simulated: release points at the loop's top (explain)",
        with_empty_cache(seg, repetition_ends(analyse(seg))), "seg", "seg_ec")  # the same requests: seg's calibrations
    add("hubert", "none", "replay of the recording", hub, "hubert", "hubert")
    add("hubert", "torch.no_grad()", "measured: the agent's --no-grad run, replayed",
        load_trace(data / "hubert_nograd_agent.pickle.xz"), "hubert_nograd_agent", "hubert_nograd")
    add("convnext", "none", "replay of the recording", load_trace(data / "convnext.pickle.xz"), "convnext", "convnext")
    add("det", "none", "replay of the recording", det, "det", "det")  # one calibration: det_cal_mid (H100)
    add("det", "empty_cache() after every batch", "simulated: release points at the repetitions' ends (explain)",
        with_empty_cache(det, repetition_ends(analyse(det))), "det", "det_ec")
    # remedies alloctune does not predict from these recordings: the real effect, for the record
    for program, remedy, name, base in (("hubert", "CUBLAS_WORKSPACE_CONFIG=:4096:8", "hubert_cublas", "hubert"),
                                        ("convnext", "cudnn.benchmark = True", "convnext_bench", "convnext")):
        out.append(dict(program=program, remedy=remedy, how="not predicted (a confirming run would measure it)",
                        cons=None, learned=None, deep=None, opt=None, peak=None, real_min=rmin[name]["min_budget"],
                        real_peak=rpeak[name]["reserved"], base_min=rmin[base]["min_budget"]))
    return out


def real(a: argparse.Namespace) -> int:
    rs = real_rows(Path(a.data))
    rows = []
    for r in rs:
        inside = "-" if r["opt"] is None else (
            "yes" if min(r["opt"], r["cons"]) <= r["real_min"] * 1.002 and r["real_min"] <= max(r["opt"], r["cons"]) * 1.002
            else "no")
        rows.append((r["program"], r["remedy"], r["how"], " / ".join(mib(r[k]) for k in ("cons", "learned", "deep", "opt")),
                     mib(r["real_min"]), " / ".join(err(r[k], r["real_min"]) for k in ("cons", "learned", "deep", "opt")),
                     inside, f"{mib(r['peak'])} / {mib(r['real_peak'])}"))
    head = ("program", "remedy", "how alloctune knows", "min budget MiB: conservative / learned / deepest / optimistic",
            "real min budget MiB (hand)", "error: conservative / learned / deepest / optimistic", "real inside the range",
            "peak reserved MiB predicted / real")
    lines = [md_table(head, rows, rule=" --- "), ""]
    lines += [f"- {r['program']} / {r['remedy']}, learned: {r['note']}" for r in rs if r.get("note")]
    print("\n".join(lines))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    Path(a.out).write_text(f"# Remedies on real programs vs the same programs remedied by hand ({stamp})\n\n"
                           f"`python bench/gpu_remedies.py real` (data: H200, torch 2.11; tests/data/remedies_gpu/real.json)"
                           "\n\n" + "\n".join(lines) + "\n")
    for r in rs:
        cands = {k: r[k] for k in ("cons", "learned", "deep", "opt") if r[k] is not None}
        pred = ", ".join(f"{k} {err(v, r['real_min'])}" for k, v in cands.items()) or "not predicted"
        log_result(f"{r['program']} / {r['remedy']}: real min budget {mib(r['real_min'])} MiB; predicted {pred}; "
                   f"peak reserved predicted {mib(r['peak'])} vs real {mib(r['real_peak'])} MiB", bench="remedies_real")
    return 0


# ---- offline: every simulated remedy on the shared recordings ------------------------------------------
def offline(a: argparse.Namespace) -> int:
    from alloctune.analysis.core import analyse
    from alloctune.remedy.model import activity, min_budget, recorded_conf
    from alloctune.remedy.registry import best_release, simulated_remedies
    from alloctune.trace import load_trace

    lines = ["# #29 on the CPU: program-level remedies simulated on the shared H200 recordings", "",
             "`python bench/gpu_remedies.py offline` (MiB; util = peak allocated / peak reserved, uncapped replay)", ""]
    for folder, name in (("rvc_ec0", "default"), ("rvc_ec0", "expandable"), ("rvc_ec0", "roundup4"), ("llm", "default")):
        path = a.traces / folder / f"{name}.pickle.xz"
        if not path.exists():
            continue
        trace = load_trace(path)
        t0 = time.perf_counter()
        an = analyse(trace)
        conf = recorded_conf(trace)
        base = min_budget(trace, conf, trace)
        rems = simulated_remedies(an, base, conf)
        secs = time.perf_counter() - t0
        peak, alloc, _, _ = activity(trace, conf, trace)
        truth = None
        real_run = a.traces / "rvc_ec1" / f"{name}.json"
        if folder == "rvc_ec0" and real_run.exists():
            truth = json.loads(real_run.read_text())["stats"]["reserved_bytes.all.peak"]
        rows = [("as recorded", mib(base, 0), "-", mib(peak, 0), f"{alloc / peak:.3f}", 0, "-", "simulated", "-")]
        for r in rems:
            rows.append((r.name, mib(r.min_budget, 0) + (f" (bound {mib(r.bound, 0)})" if r.bound is not None else ""),
                         mib(r.saving, 0), mib(r.peak_reserved, 0), "-" if r.utilization is None else f"{r.utilization:.3f}",
                         r.cleanups if r.cleanups is not None else "-", f"{r.extra_driver_calls} ({r.extra_seconds * 1e3:.0f})",
                         r.method, f"{mib(truth, 0)} ({(r.peak_reserved - truth) / truth:+.2%})"
                         if truth is not None and r.name == "empty_cache_each_repetition" else "-"))
        head = ("remedy", "min budget", "saving", "peak reserved", "util", "clean-ups", "driver calls (ms)", "method",
                "real peak of the program doing it")
        best = best_release(rems)
        lines += [f"## {folder}/{name} ({an.repeats.count} repetitions, setting `{conf or 'default'}`; {secs:.1f} s)", "",
                  md_table(head, rows, rule=" --- "), "",
                  f"best release policy: {best.name if best else 'none saves memory'}", ""]
        every = next((r for r in rems if r.name == "empty_cache_each_repetition"), None)
        msg = f"{folder}/{name}: best release {best.name if best else 'none'}"
        if best is not None:
            msg += f" saves {mib(best.saving, 0)} MiB of {mib(base, 0)}"
        if truth is not None and every is not None:
            msg += f"; empty_cache each repetition: peak {mib(every.peak_reserved, 0)} vs real {mib(truth, 0)} MiB"
        log_result(msg + f" ({secs:.1f} s)", folder=a.out, bench="remedies_offline")
    text = "\n".join(lines) + "\n"
    print(text)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "remedies_offline.md").write_text(text)
    return 0


# ---- utilization: the best setting plus remedies on the reference recordings -----------------------------
def utilization(a: argparse.Namespace) -> int:
    from alloctune.explain.api import explain

    rows, table = [], []
    for w in filter(None, a.workloads.split(",")):
        t0 = time.perf_counter()
        u = explain(SHIPPED / f"{w}_h200.atrace", top=1).utilization
        rec, best = next(r for r in u.rows if r.kind == "recording"), u.best
        why = "-" if u.reachable else u.held_back.split("; ", 1)[-1] if "; " in (u.held_back or "") else u.held_back
        table.append((w, f"{rec.utilization:.3f}", f"{best.kind} {best.name}", f"{best.utilization:.3f}",
                      f"{best.min_budget / 2**20:.0f}", "yes" if u.reachable else "no", why))
        rows.append((w, rec, best, u, len(u.rows), time.perf_counter() - t0))
    body = md_table(("workload", "as it ran", "best row", "its utilization", "its min budget MiB", "0.97 reached",
                     "what holds it back"), table)
    print(body)
    append_section(a.out, "utilization with the best setting plus remedies, reference workloads", f"`{command()}`", body)
    for w, rec, best, u, n, secs in rows:
        log_result(f"{w}: as it ran {rec.utilization:.3f}, best {best.kind} {best.name} {best.utilization:.3f} "
                   f"({'reaches' if u.reachable else 'below'} 0.97; {n} rows, {secs:.1f} s)", bench="utilization_reference")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    part = argv[0] if argv and argv[0] in ("real", "offline", "utilization") else "gpu"
    ap = argparse.ArgumentParser(prog=f"gpu_remedies.py{'' if part == 'gpu' else ' ' + part}",
                                 description=__doc__.splitlines()[0])
    if part == "gpu":
        pool_options(ap, jobs=8, deadline=520)
        ap.add_argument("--only", default="", help="comma list of programs (peaks + bisections) to run")
        ap.add_argument("--calibrate", action="store_true", help="only the calibration runs (needs the recordings in --out)")
    elif part == "real":
        ap.add_argument("--data", default=str(ROOT / "tests/data/remedies_gpu"))
        ap.add_argument("--out", default=str(ROOT / "bench/results/remedies_real.md"))
    elif part == "offline":
        ap.add_argument("--traces", type=Path, default=SHARED)
        ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    else:
        ap.add_argument("--workloads", default="rvc,llm,diffusion,train")
        ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "utilization_reference.md"))
    a = ap.parse_args(argv[part != "gpu":])
    return {"gpu": gpu, "real": real, "offline": offline, "utilization": utilization}[part](a)


if __name__ == "__main__":
    sys.exit(main())
