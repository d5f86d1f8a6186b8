"""Issue 29 on real programs: what alloctune predicts for each remedy vs the same program with the
remedy applied BY HAND, measured on the H200 (data: tests/data/remedies_gpu/, real.json says how).

For each row alloctune sees only the unchanged program's recording (and, where the row says so, the
agent's confirming run or its calibration runs under a cap); the "real" columns are other processes:
the hand-remedied program's uncapped peak reserved and its min budget bisected with fresh processes.

Min budget is given four ways because cuDNN falls back to smaller workspaces under a cap:
conservative (every request fixed), learned (fallback ladders learned from the two calibration
runs and carried over to the other calls of the same call site: trace/fallible.py `generalise`),
deepest (the same, every call of a site allowed down as far as any call went: `generalise(deepest=True)`,
shown to measure how far the evidence goes) and optimistic (workspace-shaped requests fallible down
to nothing).

    python bench/remedies_real.py [--data tests/data/remedies_gpu] [--out bench/results/remedies_real.md]
Pure CPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from alloctune.analysis.core import analyse  # noqa: E402
from alloctune.remedy.release import repetition_ends, with_empty_cache  # noqa: E402
from alloctune.sim.budget import min_budget  # noqa: E402
from alloctune.sim.replay import replay  # noqa: E402
from alloctune.trace import load_trace  # noqa: E402
from alloctune.trace.fallible import combine, generalise, learn_from_calibration, optimistic, with_fallbacks  # noqa: E402
from runlog import log_result  # noqa: E402

TOL = dict(rel_tol=0.002, abs_tol=1 << 20)


def mib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**20:.1f}"


def err(p: int | None, r: int | None) -> str:
    return "-" if p is None or not r else f"{100 * (p / r - 1):+.2f}%"


def budgets(data: Path, name: str, trace, cal: str | None) -> tuple[int, int | None, int | None, int, str]:
    """(conservative, learned from the calibration runs (generalised) or None, deepest or None, optimistic,
    what the learned model rests on)."""
    cons = min_budget(trace, None, **TOL).budget
    learned = deep = None
    note = ""
    if cal:
        model, taught = None, []
        for tag in ("mid", "tight"):
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
    opt = min_budget(optimistic(trace), None, **TOL).budget
    return cons, learned, deep, opt, note


def rows(data: Path) -> list[dict]:
    real = json.loads((data / "real.json").read_text())
    rmin, rpeak = real["min_budget"], real["peaks"]
    out = []

    def add(program, remedy, how, trace, cal, real_name):
        cons, learned, deep, opt, note = budgets(data, program, trace, cal)
        peak = replay(trace, None).peak_reserved
        rb = rmin.get(real_name, {}).get("min_budget")
        out.append(dict(program=program, remedy=remedy, how=how, cons=cons, learned=learned, deep=deep, opt=opt, peak=peak, note=note,
                        real_min=rb, real_peak=rpeak.get(real_name, {}).get("reserved")))

    seg = load_trace(data / "seg.pickle.xz")
    hub = load_trace(data / "hubert.pickle.xz")
    conv = load_trace(data / "convnext.pickle.xz")
    add("seg", "none", "replay of the recording", seg, "seg", "seg")
    add("seg", "empty_cache() after every image", "simulated: release points at the loop's top (explain)",
        with_empty_cache(seg, repetition_ends(analyse(seg))), "seg", "seg_ec")  # the same requests: seg's calibrations
    add("hubert", "none", "replay of the recording", hub, "hubert", "hubert")
    add("hubert", "torch.no_grad()", "measured: the agent's --no-grad run, replayed",
        load_trace(data / "hubert_nograd_agent.pickle.xz"), "hubert_nograd_agent", "hubert_nograd")
    add("convnext", "none", "replay of the recording", conv, "convnext", "convnext")
    det = load_trace(data / "det.pickle.xz")  # no calibration run: conservative .. optimistic is the answer
    add("det", "none", "replay of the recording", det, None, "det")
    add("det", "empty_cache() after every batch", "simulated: release points at the repetitions' ends (explain)",
        with_empty_cache(det, repetition_ends(analyse(det))), None, "det_ec")
    # remedies alloctune does not predict from these recordings: the real effect, for the record
    for program, remedy, name, base in (("hubert", "CUBLAS_WORKSPACE_CONFIG=:4096:8", "hubert_cublas", "hubert"),
                                        ("convnext", "cudnn.benchmark = True", "convnext_bench", "convnext")):
        out.append(dict(program=program, remedy=remedy, how="not predicted (a confirming run would measure it)",
                        cons=None, learned=None, deep=None, opt=None, peak=None, real_min=rmin[name]["min_budget"],
                        real_peak=rpeak[name]["reserved"], base_min=rmin[base]["min_budget"]))
    return out


def table(rs: list[dict]) -> list[str]:
    head = ("| program | remedy | how alloctune knows | min budget MiB: conservative / learned / deepest / optimistic | "
            "real min budget MiB (hand) | error: conservative / learned / deepest / optimistic | real inside the range | "
            "peak reserved MiB predicted / real |")
    lines = [head, "|" + " --- |" * 8]
    for r in rs:
        three = " / ".join(mib(r[k]) for k in ("cons", "learned", "deep", "opt"))
        errs = " / ".join(err(r[k], r["real_min"]) for k in ("cons", "learned", "deep", "opt"))
        inside = "-" if r["opt"] is None else (
            "yes" if min(r["opt"], r["cons"]) <= r["real_min"] * 1.002 and r["real_min"] <= max(r["opt"], r["cons"]) * 1.002
            else "no")
        lines.append(f"| {r['program']} | {r['remedy']} | {r['how']} | {three} | {mib(r['real_min'])} | {errs} | "
                     f"{inside} | {mib(r['peak'])} / {mib(r['real_peak'])} |")
    lines += [""] + [f"- {r['program']} / {r['remedy']}, learned: {r['note']}" for r in rs if r.get("note")]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT / "tests/data/remedies_gpu"))
    ap.add_argument("--out", default=str(ROOT / "bench/results/remedies_real.md"))
    a = ap.parse_args()
    rs = rows(Path(a.data))
    lines = table(rs)
    print("\n".join(lines))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    Path(a.out).write_text(f"# Remedies on real programs vs the same programs remedied by hand ({stamp})\n\n"
                           f"`python bench/remedies_real.py` (data: H200, torch 2.11; tests/data/remedies_gpu/real.json)\n\n"
                           + "\n".join(lines) + "\n")
    for r in rs:
        cands = {k: r[k] for k in ("cons", "learned", "deep", "opt") if r[k] is not None}
        pred = ", ".join(f"{k} {err(v, r['real_min'])}" for k, v in cands.items()) or "not predicted"
        log_result(f"{r['program']} / {r['remedy']}: real min budget {mib(r['real_min'])} MiB; predicted {pred}; "
                   f"peak reserved predicted {mib(r['peak'])} vs real {mib(r['real_peak'])} MiB")


if __name__ == "__main__":
    main()
