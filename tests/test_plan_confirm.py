"""`plan --confirm`: one real run at the predicted largest size, a step down by the bound on failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from alloctune.plan.answer import Largest, Target
from alloctune.plan.confirm import confirm

MiB = 1 << 20


class GPU:
    """A fake runner: the program at size x needs `per_size * x` bytes; logs every run."""

    def __init__(self, per_size=MiB, outcome=None):
        self.per_size, self.outcome, self.calls = per_size, outcome, []

    def __call__(self, cmd, conf=None, budget=None, env=None, stdout_to_stderr=False):
        assert stdout_to_stderr  # the program's output must not mix with plan's JSON
        x = int(env["ALLOCTUNE_SIZE"])
        assert cmd[-1] == str(x)  # {size} filled in
        self.calls.append((x, budget, conf))
        need = self.per_size * x
        out = self.outcome or ("ok" if need <= budget else "oom")
        return SimpleNamespace(outcome=out, peak_reserved=min(need, budget), wall_s=0.1)


def _result(largest, kind="cap", nbytes=1000 * MiB, bound=None, first_failing=None, conf=""):
    item = Largest(Target(kind, nbytes), largest, first_failing, False, 3, bound=bound)
    return SimpleNamespace(step="1", context_bytes=500 * MiB, settings=[SimpleNamespace(conf=conf, largest=[item])])


def test_a_right_prediction_is_confirmed_in_one_run():
    gpu = GPU()
    (c,) = confirm(_result("1000", first_failing="1001"), ["prog", "{size}"], runner=gpu, base_env={})
    assert gpu.calls == [(1000, 1000 * MiB, None)]
    assert c.confirmed == c.predicted == "1000" and len(c.runs) == 1 and "confirmed" in c.note


def test_an_over_promise_steps_down_by_the_bound_and_the_second_run_confirms():
    gpu = GPU(per_size=int(1.04 * MiB))  # the program needs 4 % more than the plan thought: truth 961
    (c,) = confirm(_result("1000", bound=0.05), ["prog", "{size}"], runner=gpu, base_env={})
    assert [x for x, _, _ in gpu.calls] == [1000, 950]  # one step of the bound (5 %)
    assert c.confirmed == "950" and 950 <= 961 and len(c.runs) == 2
    assert "failed on the GPU" in c.note and c.to_dict()["runs"][0]["passed"] is False


def test_the_step_is_at_least_two_percent_and_the_runs_are_bounded():
    gpu = GPU(per_size=2 * MiB)  # far off: two runs, then an honest "not confirmed"
    (c,) = confirm(_result("1000", bound=0.0), ["prog", "{size}"], runner=gpu, base_env={})
    assert [x for x, _, _ in gpu.calls] == [1000, 980]
    assert c.confirmed is None and "not confirmed in 2 run(s)" in c.note


def test_a_card_runs_under_its_memory_less_the_context_and_a_crash_stops():
    gpu = GPU(outcome="crash")
    (c,) = confirm(_result("100", kind="card", nbytes=4096 * MiB, conf="expandable_segments:True"),
                   ["prog", "{size}"], runner=gpu, base_env={})
    assert gpu.calls == [(100, 4096 * MiB - 500 * MiB, "expandable_segments:True")]
    assert c.confirmed is None and len(c.runs) == 1


WORK = """
import sys, torch
x = int(sys.argv[1])
keep = [torch.empty(x << 20, device="cuda"), torch.empty(2 * x << 20, device="cuda")]
print("throughput: 1 items/s")
"""


def test_plan_confirm_end_to_end_on_fake_cuda(tmp_path):
    from fake_torch import install

    install(tmp_path / "fake")
    (tmp_path / "w.py").write_text(WORK)
    import alloctune

    src = str(Path(alloctune.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), src]),
               ALLOCTUNE_STATE_DIR=str(tmp_path / "live"), HOME=str(tmp_path / "home"), COLUMNS="200")
    py = sys.executable
    (tmp_path / "rec").mkdir()
    p = subprocess.run([py, "-m", "alloctune", "record", "--size", "32,64,96,128", "--out",
                        str(tmp_path / "rec" / "w.pickle"), "--", py, str(tmp_path / "w.py"), "{size}"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([py, "-m", "alloctune", "plan", str(tmp_path / "rec"), "--cap", "1GiB", "--json",
                        "--confirm", f"{py} {tmp_path / 'w.py'} {{size}}"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    (c,) = d["confirmations"]
    # the program keeps 3x MiB live: the real largest size under 1 GiB is 341
    assert c["predicted"] is not None and len(c["runs"]) <= 2
    # extrapolated beyond 128: one run at the answer, one 2 % step up that really fails
    assert c["confirmed"] == c["predicted"] == "341" and [r["size"] for r in c["runs"]] == ["341", "347"]
    assert [r["outcome"] for r in c["runs"]] == ["ok", "oom"]
    assert all(r["budget"] == 1 << 30 for r in c["runs"])


@pytest.mark.parametrize("text,message", [("'unclosed", "No closing quotation"), ("  ", "needs a program")])
def test_a_bad_confirm_command_is_one_line_and_exit_2(capfd, text, message):
    from record_child import cli_exit

    assert cli_exit(["plan", "a.pickle:1", "b.pickle:2", "--cap", "1GiB", "--confirm", text]) == 2
    err = capfd.readouterr().err
    assert err.startswith("alloctune: error: ") and message in err and "Traceback" not in err


def test_a_bounded_answer_that_holds_is_tried_at_the_top_of_its_bound():
    """The answer kept room for its bound and held on the GPU: the second run tries the size that room
    would allow, and the answer is the larger size that completed (the real capacity is 1030 here)."""
    gpu = GPU(per_size=MiB * 1000 // 1030)
    (c,) = confirm(_result("1000", bound=0.05), ["prog", "{size}"], runner=gpu, base_env={})
    assert [x for x, _, _ in gpu.calls] == [1000, 1050]
    assert c.confirmed == "1000" and "did not" in c.note and len(c.runs) == 2
    gpu = GPU(per_size=MiB * 1000 // 1060)
    (c,) = confirm(_result("1000", bound=0.05), ["prog", "{size}"], runner=gpu, base_env={})
    assert c.confirmed == "1050" and "the answer is 1050" in c.note


def test_an_exact_answer_needs_no_second_run_and_a_missing_gpu_is_not_an_over_promise():
    gpu = GPU()
    (c,) = confirm(_result("1000", bound=0.0, first_failing="1001"), ["prog", "{size}"], runner=gpu, base_env={})
    assert len(gpu.calls) == 1 and c.confirmed == "1000"
    (c,) = confirm(_result("1000"), ["prog", "{size}"], runner=GPU(outcome="no-cuda"), base_env={})
    assert c.confirmed is None and "not a memory answer" in c.note and "over-promised" not in c.note


def test_an_extrapolated_answer_with_no_bound_is_tried_one_step_up():
    """Beyond the recordings a zero bound checked nothing there: a passing answer is tried 2 % higher, so
    the confirmed answer is within one grid step of the real largest size (here the real one is 1030)."""
    gpu = GPU(per_size=MiB * 1000 // 1030)
    item = Largest(Target("cap", 1000 * MiB), "1000", "1001", True, 3, bound=0.0)
    res = SimpleNamespace(step="1", context_bytes=0, settings=[SimpleNamespace(conf="", largest=[item])])
    (c,) = confirm(res, ["prog", "{size}"], runner=gpu, base_env={})
    assert [x for x, _, _ in gpu.calls] == [1000, 1020] and c.confirmed == "1020"


def test_a_size_the_simulation_saw_complete_again_is_tried_once_the_answer_held():
    """The simulation saw 42 fail between 41 and 43 (ViT training's micro-batch under a cap: a size law a
    hair off). 41 holds on the GPU, so the second run tries 43; the real capacity decides the answer."""
    for capacity, want in ((43, "43"), (42, "41")):
        gpu = GPU(per_size=MiB * 1000 // capacity)
        item = Largest(Target("cap", 1000 * MiB), "41", "42", False, 3, bound=0.0, completes_again="43")
        res = SimpleNamespace(step="1", context_bytes=0, settings=[SimpleNamespace(conf="", largest=[item])])
        (c,) = confirm(res, ["prog", "{size}"], runner=gpu, base_env={})
        assert [x for x, _, _ in gpu.calls] == [41, 43] and c.confirmed == want
        assert "complete again" in c.note
