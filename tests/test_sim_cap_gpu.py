"""The memory cap at its boundary, real CUDA against the simulator (skipped without a device).

One program holds 700 MiB (and in the second layout a freed 100 MiB beside it), then asks for
281 MiB + 12345 B: 282 MiB after the allocator's 2 MiB rounding, 300 MiB in the 20 MiB pages an
expandable segment maps. Caps just below and above each of those sums tell which amount the real
cap test charges. The simulator predicts each capped run from the uncapped run's recording (its
request stream, its own address model), never from the capped run itself.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from alloctune.run.runner import run_trial

pytestmark = pytest.mark.gpu
PY = sys.executable
MiB = 1 << 20
HALF = MiB // 2

PROGRAM = """
import json, torch
MiB = 1 << 20
a = torch.empty(700 * MiB, dtype=torch.uint8, device="cuda")
if {freed_tail}:
    b = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
    del b
ok = True
try:
    r = torch.empty(281 * MiB + 12345, dtype=torch.uint8, device="cuda")
    del r
except torch.OutOfMemoryError:
    ok = False
s = torch.cuda.memory_stats()
print("FACTS", json.dumps({{"ok": ok, "retries": s["num_alloc_retries"], "ooms": s["num_ooms"],
                           "peak_reserved": s["reserved_bytes.all.peak"]}}))
"""

# above the 700 MiB held: below/above 282 MiB (2 MiB rounding) and 300 MiB (20 MiB pages), and
# with the freed 100 MiB still cached, the same sums on top of it
CAPS = {False: (281, 282, 299, 300), True: (281, 282, 299, 300, 381, 382, 399, 400)}


def _facts(text: str) -> dict:
    return json.loads(text.split("FACTS ", 1)[1].splitlines()[0])


@pytest.mark.parametrize("conf", ["", "expandable_segments:True"])
@pytest.mark.parametrize("freed_tail", [False, True])
def test_cap_boundary_matches_the_simulator(tmp_path, conf, freed_tail):
    from alloctune.config import AllocatorConfig
    from alloctune.sim import replay
    from alloctune.trace import load_trace

    path = tmp_path / "p.py"
    path.write_text(textwrap.dedent(PROGRAM.format(freed_tail=freed_tail)))
    env = dict(os.environ, ALLOCTUNE_STATE_DIR=str(tmp_path))
    rec = tmp_path / "uncapped.pickle"
    res = run_trial([PY, str(path)], conf=conf, record=rec, capture=tmp_path / "rec.log", env=env)
    assert res.outcome == "ok", (tmp_path / "rec.log").read_text()
    trace = load_trace(rec)
    config = AllocatorConfig.parse(conf)
    rows, wrong = [], []
    for extra in CAPS[freed_tail]:
        budget = (700 + extra) * MiB + HALF
        log = tmp_path / f"cap{extra}.log"
        real = run_trial([PY, str(path)], conf=conf, budget=budget, capture=log, env=env)
        facts = _facts(log.read_text())
        assert real.outcome == "ok", log.read_text()  # the program catches its own OOM
        sim = replay(trace, config, budget=budget, total_memory=res.total_memory, addresses="model",
                     record_events=False)
        predicted = {"ok": sim.completed, "retries": sim.num_alloc_retries, "peak_reserved": sim.peak_reserved}
        measured = {k: facts[k] for k in predicted}
        rows.append(f"cap 700+{extra}.5 MiB: real {measured} sim {predicted}")
        if predicted != measured:
            wrong.append(rows[-1])
    print("\n".join(rows))
    assert not wrong, "\n".join(wrong)
