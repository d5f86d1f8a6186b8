"""#29 in tune: remedies beside the settings. The no-grad remedy is confirmed by ONE run of the program
with the agent's switch (the fake workload needs `no_grad_saving` bytes less then); the simulated ones come
from the baseline's real recording (the RVC traces, where the Janitor's and release points' numbers are
checked against the explain side and the real rvc_ec1 run in test_explain_remedies)."""

from __future__ import annotations

import json

from alloctune.tune.candidates import parse_knobs
from alloctune.tune.strategy import Tuner, TuneSettings
from tune_fakes import COMMAND, MiB, BatchRecorder, FakeEvaluator, FakeSimulator

INFERENCE = {"module_calls_with_grad": 120, "module_calls_without_grad": 0, "backward_calls": 0}
TRAINING = {"module_calls_with_grad": 120, "module_calls_without_grad": 0, "backward_calls": 8}


def _tune(ev, budget_mib, executor=None, **kw):
    s = TuneSettings(command=COMMAND, budget=budget_mib * MiB, knobs=parse_knobs(None), platform="linux", **kw)
    # the no-grad run's recording simulates to its own (smaller) need, as a real recording would
    factory = lambda b: FakeSimulator(ev, error=-ev.no_grad_saving if b.no_grad else 0)  # noqa: E731
    return Tuner(ev, s, simulator_factory=factory, executor=executor).run()


def test_inference_with_autograd_gets_one_confirming_run_that_turns_a_shortage_into_a_fit():
    """The HuBERT case of #29: no setting fits, one line would. Runs: the recording, the closest setting at
    the budget (as before), and the one no-grad run beside it -- three, not nine."""
    ev = FakeEvaluator(autograd=INFERENCE, no_grad_saving=900 * MiB)
    rec = BatchRecorder(ev)
    res = _tune(ev, 1500, executor=rec)
    assert res.shortfall is not None and res.ranking.best is None
    assert len(ev.calls) == 3 and ev.no_grad_calls == [(res.shortfall.conf, 1500 * MiB)]
    assert len(rec.batches[1]) == 2 and sum(r.no_grad for r in rec.batches[1]) == 1  # side by side with the closest
    ng = next(r for r in res.remedies.remedies if r.name == "no_grad")
    need = ev.need(res.shortfall.conf) - 900 * MiB  # the fake's truth with autograd off
    assert ng.method == "measured" and ng.min_budget == need and ng.saving == res.shortfall.need - need
    assert "torch.inference_mode()" in ng.how_to and "completed at" in ng.notes[0]
    assert res.shortfall.next_steps[0].startswith("inference without autograd") and "fits (measured" in \
        res.shortfall.next_steps[0]
    assert any("the line to add: with torch.inference_mode()" in n for n in res.notes)
    # the remedy's run is no trial of its setting
    closest = next(s for s in res.summaries if s.candidate.conf == res.shortfall.conf)
    assert closest.trials == 1
    d = json.loads(json.dumps(res.to_dict()))
    assert [r["name"] for r in d["remedies"]] == ["no_grad"] and d["remedies"][0]["method"] == "measured"


def test_a_training_program_gets_no_no_grad_run_and_the_fit_keeps_three_runs():
    for autograd in (TRAINING, None):
        ev = FakeEvaluator(autograd=autograd, no_grad_saving=900 * MiB)
        res = _tune(ev, 2600)
        assert len(ev.calls) == 3 and not ev.no_grad_calls
        assert res.ranking.best is not None and res.remedies.remedies == ()


def test_inference_with_autograd_costs_exactly_one_more_run_in_the_fit_case():
    plain = FakeEvaluator(autograd=TRAINING)
    _tune(plain, 2600)
    ev = FakeEvaluator(autograd=INFERENCE, no_grad_saving=300 * MiB)
    rec = BatchRecorder(ev)
    res = _tune(ev, 2600, executor=rec)
    assert len(ev.calls) == len(plain.calls) + 1
    assert any(r.no_grad for r in rec.batches[1])  # in the first batch after the recording
    best = res.ranking.best
    ng = next(r for r in res.remedies.remedies if r.name == "no_grad")
    assert ng.conf == best.candidate.conf and ng.min_budget == ev.need(best.candidate.conf) - 300 * MiB
    # the setting's answer is the same as without the remedy
    assert best.min_budget is not None and best.verified


def test_a_program_that_needs_autograd_fails_its_no_grad_run_and_the_sweep_goes_on():
    class NeedsGrad(FakeEvaluator):
        def __call__(self, conf, budget, *, no_grad=False, **kw):
            res = super().__call__(conf, budget, no_grad=no_grad, **kw)
            if no_grad:
                from dataclasses import replace

                return replace(res, outcome="crash", exit_code=1, error="RuntimeError: element 0 of tensors does "
                               "not require grad")
            return res

    ev = NeedsGrad(autograd=INFERENCE, no_grad_saving=300 * MiB)
    res = _tune(ev, 2600)
    ng = next(r for r in res.remedies.remedies if r.name == "no_grad")
    assert ng.min_budget is None and "needs autograd" in ng.notes[0]
    assert res.ranking.best is not None


def test_no_remedies_option_keeps_the_old_flow():
    ev = FakeEvaluator(autograd=INFERENCE, no_grad_saving=300 * MiB)
    res = _tune(ev, 2600, remedies=False)
    assert not ev.no_grad_calls and res.remedies is None and res.to_dict()["remedies"] == []


def test_simulated_remedies_and_utilization_from_a_real_recording(traces_dir):
    """A tune whose baseline recording is the real RVC run (the GPU answered from the real simulator's own
    needs): the remedies are simulated under the best setting, the best release policy is named with its
    Janitor arguments, and the utilization table has a row per setting with a min budget and per remedy."""
    from alloctune.tune.simulator import SimulatorFromTrace

    path = str(traces_dir / "rvc_ec0" / "default.pickle.xz")
    confs = ["", "expandable_segments:True"]
    from alloctune.run.trial import TrialResult

    probe = TrialResult(command=COMMAND, conf="", budget=None, outcome="ok", exit_code=0, wall_s=1.0,
                        snapshot=path, total_memory=150109880320, torch_version="2.11.0")
    needs = SimulatorFromTrace(probe).estimates(confs)
    ev = FakeEvaluator(needs=needs, snapshot=path, total=150109880320)
    s = TuneSettings(command=COMMAND, budget=needs[""] - 64 * MiB, knobs=parse_knobs(["expandable"]), platform="linux")
    res = Tuner(ev, s, simulator_factory=lambda b: SimulatorFromTrace(b)).run()
    assert res.ranking.best.candidate.conf == "expandable_segments:True"
    rep = res.remedies
    names = [r.name for r in rep.remedies]
    assert {"empty_cache_each_repetition", "janitor", "janitor_by_size"} <= set(names)
    assert all(r.conf == "expandable_segments:True" for r in rep.remedies)
    rows = {(r.kind, r.name): r for r in rep.utilization.rows}
    assert ("setting", "expandable_segments:True") in rows and ("setting", "(default)") in rows
    assert ("remedy", "janitor") in rows
    best = res.ranking.best
    row = rows[("setting", "expandable_segments:True")]
    assert (row.min_budget, row.method) == ((best.min_budget, "measured") if best.min_budget is not None
                                            else (best.sim_min_budget, "simulated"))
    # savings against the simulation of the recording under the same setting: a policy that never cleans saves 0
    for r in rep.remedies:
        if r.cleanups == 0:
            assert r.saving == 0
    if rep.best_release is not None:
        assert rep.best_release.saving > 0 and rep.best_release.cleanups > 0
    d = res.to_dict()
    assert d["utilization"]["rows"] and all(set(r) >= {"name", "min_budget", "saving", "method", "how_to"}
                                            for r in d["remedies"])


def test_a_shortage_ends_with_the_next_command_plan_then_chunked_in_tune_and_diagnose(traces_dir):
    """#29.4: where no setting helps, the last steps are the command to run next: the plan call that finds the
    largest input under the budget, then the guard.chunked call for a service."""
    ev = FakeEvaluator()
    res = _tune(ev, 1500)
    steps = res.shortfall.next_steps
    assert "alloctune plan sizes/ --budget 1500MiB" in steps[-2] and "alloctune.guard.chunked(" in steps[-1]
    assert "at least" in steps[-3]  # the budget the closest setting needs comes before them

    from alloctune.diagnose.snapshot import diagnose_snapshot

    path = traces_dir / "rvc_ec1" / "gc07_split256_cap115a.pickle.xz"
    probe = diagnose_snapshot(path, candidates=None)
    tight = diagnose_snapshot(path, candidates=None, budget=probe.allocated + probe.request // 2)
    nexts = [e for e in tight.evidence if e.startswith("next: ")]
    assert tight.verdict == "shortage" and "alloctune plan sizes/" in nexts[-2] and "guard.chunked" in nexts[-1]
    assert tight.evidence[-1] == nexts[-1]


def test_the_remedies_are_simulated_once_beside_the_gpu_runs(traces_dir, monkeypatch):
    """Simulated in a thread while the GPU runs (the planned best), started only once the opening runs
    are chosen (until then the choosing has the CPU); reused when the best stayed the same."""
    import threading

    import alloctune.tune.remedies as tr
    from alloctune.run.trial import TrialResult
    from alloctune.tune.confirm import ConfirmFlow
    from alloctune.tune.simulator import SimulatorFromTrace

    calls = []
    real = tr.simulate

    def counted(sim, baseline, conf, command):
        calls.append((conf, threading.current_thread().name))
        return real(sim, baseline, conf, command)

    monkeypatch.setattr(tr, "simulate", counted)
    at_open = []
    real_open = ConfirmFlow._open

    def opening(self, *args):
        at_open.append(len(calls))
        return real_open(self, *args)

    monkeypatch.setattr(ConfirmFlow, "_open", opening)
    path = str(traces_dir / "rvc_ec0" / "default.pickle.xz")
    probe = TrialResult(command=COMMAND, conf="", budget=None, outcome="ok", exit_code=0, wall_s=1.0,
                        snapshot=path, total_memory=150109880320, torch_version="2.11.0")
    needs = SimulatorFromTrace(probe).estimates(["", "expandable_segments:True"])
    ev = FakeEvaluator(needs=needs, snapshot=path, total=150109880320)
    s = TuneSettings(command=COMMAND, budget=needs[""] - 64 * MiB, knobs=parse_knobs(["expandable"]), platform="linux")
    res = Tuner(ev, s, simulator_factory=lambda b: SimulatorFromTrace(b)).run()
    assert calls == [("expandable_segments:True", "alloctune-remedies")]
    assert at_open == [0]  # not started while the opening runs were being chosen
    assert res.remedies.remedies and all(r.conf == "expandable_segments:True" for r in res.remedies.remedies)
    ended = [t.ended_at_s for t in res.trials]  # when the sweep had each result, from its start
    assert None not in ended and ended == sorted(ended) and ended[0] >= 0
    assert [t["ended_at_s"] for t in res.to_dict()["trials"]] == ended


def test_a_program_that_turns_autograd_back_on_is_not_measured_by_the_switch():
    """The agent's switch turns grad mode off at start; a program that calls torch.enable_grad() itself
    undoes it (seen on the H200: the 'no-grad' run ran out of memory like the plain one). Its module
    calls with grad on give it away: no measured saving is claimed."""
    from alloctune.remedy.measured import no_grad_remedy
    from alloctune.run.trial import TrialResult

    fields = dict(command=["p"], conf="", budget=1 << 30, outcome="oom", exit_code=1, wall_s=1.0,
                  peak_reserved=1 << 30, peak_allocated=1 << 29, num_alloc_retries=0, num_ooms=1, no_grad=True,
                  autograd={"backward_calls": 0, "module_calls_with_grad": 48, "module_calls_without_grad": 0})
    trial = TrialResult(**{k: v for k, v in fields.items() if k in TrialResult.__dataclass_fields__})
    r = no_grad_remedy(trial, "", 2 << 30, None, "python p.py")
    assert r.min_budget is None and r.method == "needs a confirming run" and "turns autograd back on" in r.notes[0]


def _conv_tune(ev, budget_mib, executor=None):
    """`_tune` with a baseline recording that shows a 64 MiB cuDNN workspace (C++ frames)."""
    from test_explain_remedies import _gemm_program

    from alloctune.trace.load import trace_from_snapshot

    conv = trace_from_snapshot(_gemm_program(128 << 10, conv_ws=64 << 20)[0], source="conv")
    s = TuneSettings(command=COMMAND, budget=budget_mib * MiB, knobs=parse_knobs(None), platform="linux")

    def factory(b):
        sim = FakeSimulator(ev, error=-ev.cudnn_saving if b.cudnn_benchmark_set is not None and
                            b.cudnn_benchmark == b.cudnn_benchmark_set else 0)
        sim.raw = conv
        return sim
    return Tuner(ev, s, simulator_factory=factory, executor=executor).run()


def test_where_nothing_fits_convolution_workspaces_get_one_run_of_the_cudnn_switch_the_other_way():
    """#29.3: no setting fits 1700 MiB, the recording shows cuDNN workspaces whose giving up would fit, and the
    program ran with benchmark off: ONE run with the agent's switch on, beside the closest setting's run,
    measured (its own recording's min budget), in place of the listed unconfirmed candidate; then the
    shortfall's next steps start with it, since it fits."""
    plain = FakeEvaluator(cudnn_benchmark=None, cudnn_saving=600 * MiB)
    _conv_tune(plain, 1700)
    ev = FakeEvaluator(cudnn_benchmark=False, cudnn_saving=600 * MiB)
    rec = BatchRecorder(ev)
    res = _conv_tune(ev, 1700, executor=rec)
    assert res.shortfall is not None and len(plain.calls) == 2 and not plain.cudnn_calls  # flag unknown: no run
    closest = res.shortfall.conf
    assert len(ev.calls) == 3 and ev.cudnn_calls == [(closest, 1700 * MiB, True)]
    assert len(rec.batches[1]) == 2 and sum(r.cudnn_benchmark is not None for r in rec.batches[1]) == 1
    names = [r.name for r in res.remedies.remedies]
    assert "cudnn_benchmark_on" in names and "cudnn_benchmark_off" not in names
    on = next(r for r in res.remedies.remedies if r.name == "cudnn_benchmark_on")
    assert on.method == "measured" and on.min_budget == ev.need(closest) - 600 * MiB
    assert on.how_to.startswith("torch.backends.cudnn.benchmark = True")
    assert on.confirm.startswith("alloctune run --cudnn-benchmark on --budget")
    assert res.shortfall.next_steps[0].startswith("cuDNN autotuning on") and "fits (measured" in res.shortfall.next_steps[0]
    assert next(s for s in res.summaries if s.candidate.conf == closest).trials == 1  # no trial of its setting


def test_where_a_setting_fits_the_cudnn_switch_is_listed_not_run():
    """A fit keeps tune's three runs: the switch (a few percent at most) is listed with its command."""
    ev = FakeEvaluator(cudnn_benchmark=False, cudnn_saving=150 * MiB)
    res = _conv_tune(ev, 2600)
    assert res.ranking.best is not None and len(ev.calls) == 3 and not ev.cudnn_calls
    listed = [r for r in res.remedies.remedies if r.name.startswith("cudnn_benchmark")]
    assert listed and all(r.method == "needs a confirming run" for r in listed)


def test_a_program_that_sets_cudnn_benchmark_itself_is_not_measured_by_the_switch():
    ev = FakeEvaluator(cudnn_benchmark=False, cudnn_saving=600 * MiB, cudnn_sticky=True)
    res = _conv_tune(ev, 1700)
    assert len(ev.cudnn_calls) == 1
    on = next(r for r in res.remedies.remedies if r.name == "cudnn_benchmark_on")
    assert on.method == "needs a confirming run" and on.min_budget is None
    assert "sets torch.backends.cudnn.benchmark itself" in on.notes[0]


def test_a_transformer_recording_gets_no_cudnn_run():
    """Scratch requests of a model without convolutions (Python stacks say so) are no cuDNN workspaces."""
    from pathlib import Path

    from alloctune.remedy.workspaces import cudnn_requests
    from alloctune.trace import load_trace

    data = Path(__file__).parent / "data"
    llama = load_trace(data / "explain_gpu" / "llama_generate.pickle.xz")
    found, evidence = cudnn_requests(llama)
    assert found == set() and "Python stacks" in evidence
    hubert = load_trace(data / "remedies_gpu" / "hubert.pickle.xz")
    found, evidence = cudnn_requests(hubert)
    sizes = hubert.requests.sizes
    assert found and "Python stacks" in evidence and max(sizes[i] for i in found) > 64 * MiB


def _train_tune(ev, budget_mib, executor=None):
    """`_tune` with a baseline recording of a training loop over repeated blocks (phases, layers)."""
    from test_explain_training import layered_program

    from alloctune.trace.load import trace_from_snapshot

    train = trace_from_snapshot(layered_program()[0], source="train")
    s = TuneSettings(command=COMMAND, budget=budget_mib * MiB, knobs=parse_knobs(None), platform="linux")

    def factory(b):
        sim = FakeSimulator(ev, error=-ev.checkpointing_saving if b.checkpointing else 0)
        sim.raw = train
        return sim
    return Tuner(ev, s, simulator_factory=factory, executor=executor).run()


def test_where_nothing_fits_a_training_program_gets_one_checkpointing_run_and_it_comes_first():
    """#36.4: a training program (the baseline ran backward) that no setting fits, whose recording shows
    repeated blocks: ONE run with the agent's checkpointing switch beside the closest setting's run
    (three runs in all), measured, and the shortfall's next steps start with its line when it fits."""
    ev = FakeEvaluator(autograd={"module_calls_with_grad": 40, "backward_calls": 4}, checkpointing_saving=600 * MiB)
    res = _train_tune(ev, 1700)
    assert res.shortfall is not None
    closest = res.shortfall.conf
    assert len(ev.calls) == 3 and ev.checkpointing_calls == [(closest, 1700 * MiB)]
    ck = [r for r in res.remedies.remedies if r.name == "checkpointing"]
    assert len(ck) == 1 and ck[0].method == "measured" and ck[0].min_budget == ev.need(closest) - 600 * MiB
    assert ck[0].confirm.startswith("alloctune run --checkpointing --budget")
    assert res.shortfall.next_steps[0].startswith("activation checkpointing") and "fits (measured" in \
        res.shortfall.next_steps[0]
    assert not any("guard.chunked" in s for s in res.shortfall.next_steps)
    assert any("micro-batch" in s for s in res.shortfall.next_steps)
    inference = FakeEvaluator(checkpointing_saving=600 * MiB)
    _train_tune(inference, 1700)
    assert not inference.checkpointing_calls  # no backward in the baseline: no checkpointing run


def test_a_recommendation_whose_run_survived_caught_ooms_says_so_with_the_fallback_free_budget():
    """#37: a completing run that survived OOMs the program caught (cuDNN's fallbacks) is said so, with the
    budget where none happen: measured where a run of the setting caught none, and never the simulated
    need when that lies at or below a budget where they really happened (measured on the H100: a Faster
    R-CNN whose simulated need was 1.87 GiB caught 5 at 1.87 GiB and none at 2.35 GiB)."""
    from alloctune.tune.recommend import recommend

    plain = _tune(FakeEvaluator(), 2600)
    assert plain.ranking.best is not None and recommend(plain).fallbacks is None
    best = plain.ranking.best.candidate.conf
    ev = FakeEvaluator(caught_ooms={best: 5})  # every capped run catches them: the simulated need is no answer
    rec = recommend(_tune(ev, 2600))
    assert rec.conf == best and rec.fallbacks is not None and rec.fallbacks["ooms_caught"] == 5
    assert rec.fallbacks["fallback_free_budget"] is None and "was not measured" in rec.summary
    assert "survived 5 out-of-memory error(s)" in rec.summary and rec.to_dict()["fallbacks"]["ooms_caught"] == 5
    edge = ev.need(best) + 64 * MiB
    clean = FakeEvaluator(caught_ooms={best: 5}, clean_from={best: edge})  # runs from the edge up catch none
    rec = recommend(_tune(clean, 3200))  # the default completes there: the setting is timed alone at the budget
    above = [b for c, b, *_ in clean.calls if c == best and b is not None and b >= edge]
    assert above == [3200 * MiB], "one run of the setting alone at the budget, because it caught OOMs"
    assert rec.fallbacks is not None and rec.fallbacks["fallback_free_method"] == "measured"
    assert rec.fallbacks["fallback_free_budget"] == min(above) and "none caught (measured)" in rec.summary