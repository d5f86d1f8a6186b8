"""A fake workload for the tuning logic: each setting has a known memory need.

`FakeEvaluator(needs)` answers a trial like the GPU would for a deterministic workload that
completes iff budget ≥ need[setting]; every call is logged so tests can count GPU trials.
"""

from __future__ import annotations

from alloctune.run.trial import TrialResult
from alloctune.tune.executors.base import BatchRecorder  # noqa: F401 - the tests' executor

MiB = 1 << 20
GiB = 1 << 30
COMMAND = ("python", "work.py")

SEGMENTS = [
    (2 * MiB, 10),
    (20 * MiB, 5),
    (64 * MiB, 1),
    (130 * MiB, 2),
    (256 * MiB, 1),
    (300 * MiB, 1),
    (512 * MiB, 1),
    (1024 * MiB, 1),
]


def split_need(v_mb: int) -> int:
    """max_split_size_mb:v needs less the smaller v is; above 300 it behaves like the default."""
    return (1800 + 2 * v_mb) * MiB if v_mb <= 300 else 3000 * MiB


NEEDS = {
    "": 3000 * MiB,
    "expandable_segments:True": 2100 * MiB,
    "garbage_collection_threshold:0.6": 2050 * MiB,
    "roundup_power2_divisions:4": 2700 * MiB,
}
THROUGHPUT = {"garbage_collection_threshold:0.6": 90.0}


class FakeEvaluator:
    def __init__(self, needs=None, *, total=8 * GiB, crash_on=None, timeout_on=None, snapshot="/dev/null",
                 ignored=(), throughputs=None, autograd=None, no_grad_saving=0, cudnn_benchmark=None,
                 cudnn_saving=0, cudnn_sticky=False, checkpointing_saving=0, caught_ooms=None, clean_from=None):
        """`ignored`: settings the child silently does not apply (read back as the default);
        `throughputs`: conf -> samples handed out in turn (noise), else THROUGHPUT / 100."""
        self.needs = dict(NEEDS if needs is None else needs)
        self.ignored = set(ignored)
        self.throughputs = {k: list(v) for k, v in (throughputs or {}).items()}
        self._served: dict[str, int] = {}
        self.total = total
        self.crash_on = crash_on
        self.timeout_on = timeout_on
        self.snapshot = snapshot
        self.calls: list[tuple[str, int | None, int, bool, bool]] = []
        self.autograd = autograd  # what the baseline's agent counted (module calls with grad, backward calls)
        self.no_grad_saving = no_grad_saving  # bytes the program needs less with autograd off
        self.no_grad_calls: list[tuple[str, int | None]] = []
        # cuDNN: how the program leaves cudnn.benchmark (None: unknown, an older agent), the bytes it needs
        # less with the switch the other way, and whether it sets the flag back itself (the switch then fails)
        self.cudnn_benchmark = cudnn_benchmark
        self.cudnn_saving = cudnn_saving
        self.cudnn_sticky = cudnn_sticky
        self.cudnn_calls: list[tuple[str, int | None, bool]] = []
        self.checkpointing_saving = checkpointing_saving  # bytes the program needs less with checkpointing on
        self.checkpointing_calls: list[tuple[str, int | None]] = []
        # conf -> OOMs a completing capped run caught itself (cuDNN's fallbacks): passed, yet num_ooms > 0
        self.caught_ooms = dict(caught_ooms or {})
        self.clean_from = dict(clean_from or {})  # conf -> the budget from which its runs catch none

    def need(self, conf: str) -> int:
        if conf.startswith("max_split_size_mb:"):
            return split_need(int(conf.split(":")[1]))
        return self.needs[conf]

    def _without_grad(self):
        """What the real agent counts under its no-grad switch: the same module calls, none with grad."""
        a = dict(self.autograd or {})
        if a:
            a["module_calls_without_grad"] = a.get("module_calls_without_grad", 0) + a.get("module_calls_with_grad", 0)
            a["module_calls_with_grad"] = 0
        return a or None

    def __call__(self, conf, budget, *, repeat=0, record=False, ensure_cap=False, no_grad=False,
                 cudnn_benchmark=None, checkpointing=False):
        self.calls.append((conf, budget, repeat, record, ensure_cap))
        if checkpointing:
            self.checkpointing_calls.append((conf, budget))
        if no_grad:
            self.no_grad_calls.append((conf, budget))
        switched = cudnn_benchmark is not None and not self.cudnn_sticky
        if cudnn_benchmark is not None:
            self.cudnn_calls.append((conf, budget, cudnn_benchmark))
        base = dict(command=COMMAND, conf=conf, budget=budget, wall_s=1.0, total_memory=self.total,
                    torch_version="2.11.0+cu130", device_name="Fake H200", repeat=repeat)
        if conf == self.crash_on:
            return TrialResult(outcome="crash", exit_code=1, error="ValueError: bad input", **base)
        if conf == self.timeout_on:
            return TrialResult(outcome="timeout", exit_code=-15, error="killed at the timeout", **base)
        applied = "" if conf in self.ignored else conf
        need = self.need(applied) - (self.no_grad_saving if no_grad else 0) - (self.cudnn_saving if switched else 0)
        need -= self.checkpointing_saving if checkpointing else 0
        ok = budget is None or budget >= need
        peak_reserved = min(need, budget) if budget is not None else need
        warnings = (f"the allocator parsed '', not {conf!r} (the program set its own?)",) if conf in self.ignored else ()
        return TrialResult(
            outcome="ok" if ok else "oom",
            exit_code=0 if ok else 1,
            peak_reserved=peak_reserved,
            peak_allocated=1900 * MiB,
            num_alloc_retries=0 if ok else 1,
            num_ooms=(self.caught_ooms.get(conf, 0) if budget is not None and budget < self.clean_from.get(
                conf, budget + 1) else 0) if ok else 1,
            throughput=self._throughput(conf) if ok else None,
            allocator_settings={"PYTORCH_CUDA_ALLOC_CONF": applied},
            warnings=warnings,
            throughput_unit="items/s",
            snapshot=self.snapshot if record else None,
            segment_sizes=tuple(SEGMENTS) if record else None,
            autograd=(self._without_grad() if no_grad else self.autograd) if record else None,
            no_grad=no_grad,
            cudnn_benchmark=cudnn_benchmark if switched else self.cudnn_benchmark,
            cudnn_benchmark_set=cudnn_benchmark,
            checkpointing=("Model.gradient_checkpointing_enable() (transformers)",) if checkpointing else None,
            **base,
        )

    def _throughput(self, conf):
        seq = self.throughputs.get(conf)
        if not seq:
            return THROUGHPUT.get(conf, 100.0)
        k = self._served.get(conf, 0)
        self._served[conf] = k + 1
        return seq[k % len(seq)]

    def fresh(self) -> int:
        return len(self.calls)


class FakeSimulator:
    """Predicts each setting's need exactly (offset by `error` bytes)."""

    def __init__(self, evaluator: FakeEvaluator, error: int = 0):
        self.evaluator = evaluator
        self.error = error
        self.asked: list[str] = []

    def min_budget(self, conf: str) -> int | None:
        self.asked.append(conf)
        return self.evaluator.need(conf) + self.error

    def estimates(self, confs):
        return {c: self.min_budget(c) for c in confs}
