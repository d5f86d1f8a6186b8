"""The real min budget of a command on the GPU: the smallest `alloctune run --budget` under which it exits 0.

A k-ary search instead of a bisection: each round runs K budgets side by side in fresh processes
(memory outcomes do not depend on timing, so processes may share the GPU), then narrows to the
bracket between the largest budget that failed and the smallest that passed. Two rounds of 8 give
the answer to 1/81 of the first range.

    python3 bench/real_min_budget.py --lo 1GiB --hi 2GiB [--conf SETTING] [--rounds 2] [--k 8] -- CMD ...

Prints one JSON line: {"min_budget": bytes or null, "failed_below": bytes, "runs": n, "rounds": [...]}.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from alloctune.units import parse_user_size  # noqa: E402


def passes(cmd: list[str], budget: int, conf: str, timeout: float) -> bool:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-m", "alloctune", "run", "--conf", conf, "--budget", f"{budget}B",
                        "--timeout", str(timeout), "--", *cmd], env=env, capture_output=True, text=True,
                       timeout=timeout + 60)
    return r.returncode == 0


def real_min_budget(cmd: list[str], lo: int, hi: int, conf: str = "", rounds: int = 2, k: int = 8,
                    timeout: float = 300) -> dict:
    """Search [lo, hi] (hi must pass) for the smallest passing budget; `failed_below` is the largest failing one."""
    runs, history = 0, []
    for _ in range(rounds):
        step = (hi - lo) / (k + 1)
        budgets = [int(lo + step * (i + 1)) for i in range(k)]
        with cf.ThreadPoolExecutor(k) as ex:
            ok = list(ex.map(lambda b: passes(cmd, b, conf, timeout), budgets))
        runs += k
        history.append(dict(zip(map(str, budgets), ok)))
        failing = [b for b, o in zip(budgets, ok) if not o]
        passing = [b for b, o in zip(budgets, ok) if o]
        if failing:
            lo = max(failing)
        new_hi = min((b for b in passing if b > lo), default=hi)
        hi = new_hi
    return {"min_budget": hi, "failed_below": lo, "runs": runs, "rounds": history, "conf": conf}


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: real_min_budget.py --lo SIZE --hi SIZE [--conf C] [--rounds N] [--k K] -- CMD ...",
              file=sys.stderr)
        return 2
    i = argv.index("--")
    ap = argparse.ArgumentParser()
    ap.add_argument("--lo", required=True)
    ap.add_argument("--hi", required=True)
    ap.add_argument("--conf", default="")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--k", type=int, default=8)
    a = ap.parse_args(argv[:i])
    res = real_min_budget(argv[i + 1 :], parse_user_size(a.lo, "--lo"), parse_user_size(a.hi, "--hi"), a.conf,
                          a.rounds, a.k)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
