"""Trainer hooks (`alloctune.integrations`): a real transformers `Trainer` that runs out of memory.

On the CPU there is no allocator history, so the CUDA side is a fake (`FakeCuda`) whose
`snapshot()` returns a real OOM snapshot recorded on an H200 under a cap (the shared
`tests/data/cap_oom/convnext.pickle.xz`, its own run record removed): the hooks must write their
run record into it, and the diagnosis must read the cap back from that record. The model, the
`Trainer`, the callback events and the OOM's way out of `trainer.train()` are all real.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from alloctune import api  # noqa: E402
from alloctune.errors import EnvironmentProblem, InputError  # noqa: E402
from alloctune.integrations import DeviceLimits, OOMRecorder, TorchCuda, oom_guard  # noqa: E402
from alloctune.integrations.backend import run_record as build_run_record  # noqa: E402
from alloctune.integrations.lightning import LightningHooks  # noqa: E402
from alloctune.integrations.optional import framework_class  # noqa: E402
from alloctune.trace.load import load_snapshot  # noqa: E402
from alloctune.trace.stream import RUN_RECORD_KEY, run_record  # noqa: E402

DATA = Path(__file__).parent / "data" / "cap_oom"
# The H200 run of convnext.pickle.xz: its card and its cap (bytes), as its own run record says.
TOTAL = 150_109_880_320
CAP = 542_099_349
COMMAND = ["train.py", "--lr", "1e-3"]


class FakeCuda:
    """`CudaBackend` without a GPU: counts start/stop, hands out a recorded snapshot."""

    def __init__(self, snapshot: dict[str, Any], fraction: float | None = CAP / TOTAL) -> None:
        self._snapshot = snapshot
        self.fraction = fraction
        self.started: list[tuple[int, str]] = []
        self.stopped = 0

    def available(self) -> bool:
        return True

    def start_history(self, max_entries: int, stacks: str) -> None:
        self.started.append((max_entries, stacks))

    def stop_history(self) -> None:
        self.stopped += 1

    def snapshot(self) -> dict[str, Any]:
        return self._snapshot

    def limits(self) -> DeviceLimits:
        return DeviceLimits(0, TOTAL, self.fraction)

    def torch_version(self) -> str:
        return "2.11.0+cu130"


@pytest.fixture(scope="module")
def oom_snapshot() -> dict[str, Any]:
    """A real capped OOM snapshot without its run record (the hooks must supply one)."""
    snap = load_snapshot(DATA / "convnext.pickle.xz")
    snap.pop(RUN_RECORD_KEY)
    return snap


@pytest.fixture(autouse=True)
def no_conf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("ALLOCTUNE_AGENT", raising=False)


def tiny_trainer(out: Path, callbacks: list[Any], device: str = "cpu") -> Any:
    """A 2-layer, hidden-32 BERT classifier with random weights, on 16 in-memory examples."""
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(config)
    data = [{"input_ids": torch.randint(0, 64, (12,)), "attention_mask": torch.ones(12, dtype=torch.long),
             "labels": torch.tensor(i % 2)} for i in range(16)]
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=4,
                             use_cpu=device == "cpu", report_to=[], save_strategy="no", logging_strategy="no",
                             disable_tqdm=True, dataloader_num_workers=0)
    return Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)


def oom_at_step(trainer: Any, step: int) -> tuple[list[int], BaseException]:
    """Make the trainer's `step`-th training step raise a CUDA OOM (earlier steps run for real)."""
    calls: list[int] = []
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 has a total capacity "
                                   "of 139.81 GiB of which 132.45 GiB is free.")
    real = trainer.training_step

    def step_or_oom(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == step:
            raise error
        return real(*args, **kwargs)

    trainer.training_step = step_or_oom
    return calls, error


def test_an_oom_in_trainer_train_is_reported_in_one_line_and_re_raised(tmp_path, oom_snapshot):
    from alloctune.integrations.transformers import AlloctuneCallback, alloctune_oom_guard

    fake, out = FakeCuda(oom_snapshot), io.StringIO()
    callback = AlloctuneCallback(tmp_path / "oom", max_entries=50_000, backend=fake, stream=out, command=COMMAND)
    trainer = tiny_trainer(tmp_path / "run", [callback])
    calls, error = oom_at_step(trainer, 2)

    with pytest.raises(torch.OutOfMemoryError) as raised:
        with alloctune_oom_guard(trainer):
            trainer.train()

    assert raised.value is error  # the same OOM, not a wrapper: training still fails
    assert len(calls) == 2  # step 1 trained for real, step 2 failed
    assert fake.started == [(50_000, "python")] and fake.stopped == 1  # on_train_begin, then the guard's exit
    files = sorted((tmp_path / "oom").iterdir())
    assert len(files) == 1 and re.fullmatch(r"oom-snapshot\.\d+\.pickle", files[0].name)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("fragmentation: Fragmentation within the 516.99 MiB budget")
    assert f"next: alloctune explain {files[0]} ; alloctune tune --budget {CAP}B -- python train.py --lr 1e-3" \
        in lines[0]
    assert [n.verdict for n in callback.recorder.notes] == ["fragmentation"]


def test_the_run_record_is_read_back_and_its_cap_is_the_budget(tmp_path, oom_snapshot, monkeypatch):
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "garbage_collection_threshold:0.6")
    recorder = OOMRecorder(tmp_path, backend=FakeCuda(oom_snapshot), stream=io.StringIO(), command=COMMAND)
    note = recorder.report_oom(torch.OutOfMemoryError("CUDA out of memory."))
    assert note.snapshot is not None
    written = load_snapshot(note.snapshot)  # through alloctune's own safe loader
    assert run_record(written, str(note.snapshot)) == {
        "cap": CAP, "total_memory": TOTAL, "torch": "2.11.0+cu130", "conf": "garbage_collection_threshold:0.6",
        "device": 0, "cmd": COMMAND}
    assert written["device_traces"] == oom_snapshot["device_traces"]  # the history itself is untouched
    diagnosis = api.diagnose_snapshot(str(note.snapshot))
    assert diagnosis.budget_source == "recorded cap" and diagnosis.budget == CAP
    assert (note.verdict, note.budget) == (diagnosis.verdict, CAP)


def test_the_cap_is_the_fraction_of_the_card_and_unknown_stays_unknown():
    gib = 1 << 30
    assert DeviceLimits(0, 8 * gib, 0.25).cap == 2 * gib
    assert DeviceLimits(0, 8 * gib, 1.0).cap == 0  # no cap set
    assert DeviceLimits(0, 8 * gib, None).cap is None  # a torch that cannot say
    assert "cap" not in build_run_record(DeviceLimits(1, 8 * gib, None), "2.1.0", ["x.py"])
    assert build_run_record(DeviceLimits(1, 8 * gib, 0.5), "2.1.0", ["x.py"])["cap"] == 4 * gib


def test_an_undiagnosable_oom_still_gets_its_line_its_file_and_propagates(tmp_path, oom_snapshot):
    """A history without an `oom` entry (say, a cuBLAS OOM): the file is kept, the line says why."""
    events = [e for e in oom_snapshot["device_traces"][0] if e["action"] != "oom"]
    fake, out = FakeCuda({**oom_snapshot, "device_traces": [events]}), io.StringIO()
    with pytest.raises(torch.OutOfMemoryError):
        with oom_guard(OOMRecorder(tmp_path, backend=fake, stream=out, command=COMMAND)):
            raise torch.OutOfMemoryError("CUDA out of memory.")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("undiagnosed: TraceError: ")
    assert "holds no `oom` entry" in lines[0] and f"alloctune tune --budget {CAP}B" in lines[0]
    assert len(list(tmp_path.glob("oom-snapshot.*.pickle"))) == 1


def test_a_second_oom_gets_its_own_file(tmp_path, oom_snapshot):
    recorder = OOMRecorder(tmp_path, backend=FakeCuda(oom_snapshot), stream=io.StringIO(), command=COMMAND)
    first, second = (recorder.report_oom(torch.OutOfMemoryError("CUDA out of memory.")) for _ in range(2))
    assert first.snapshot != second.snapshot and second.snapshot is not None
    assert second.snapshot.name.endswith("-2.pickle")


def test_under_the_agent_the_history_is_left_to_it(tmp_path, oom_snapshot, monkeypatch):
    monkeypatch.setenv("ALLOCTUNE_AGENT", "{}")
    fake = FakeCuda(oom_snapshot)
    recorder = OOMRecorder(tmp_path, backend=fake, stream=io.StringIO())
    assert recorder.start() is False
    recorder.stop()
    assert fake.started == [] and fake.stopped == 0


def test_other_errors_pass_untouched(tmp_path, oom_snapshot):
    out = io.StringIO()
    with pytest.raises(ValueError, match="not memory"):
        with oom_guard(OOMRecorder(tmp_path, backend=FakeCuda(oom_snapshot), stream=out)):
            raise ValueError("not memory")
    assert out.getvalue() == "" and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_without_cuda_the_real_backend_records_nothing_and_still_says_one_line(tmp_path):
    from alloctune.integrations.transformers import AlloctuneCallback, alloctune_oom_guard

    trainer = tiny_trainer(tmp_path / "run", [])
    oom_at_step(trainer, 1)
    out = io.StringIO()
    with pytest.raises(torch.OutOfMemoryError):
        with alloctune_oom_guard(trainer, tmp_path / "oom", stream=out, command=COMMAND) as recorder:
            trainer.train()
    assert isinstance(recorder.backend, TorchCuda) and not recorder.recording
    assert sum(isinstance(cb, AlloctuneCallback) for cb in trainer.callback_handler.callbacks) == 1  # added once
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("undiagnosed: no allocator history to diagnose: CUDA is not available")
    assert lines[0].endswith("next: alloctune tune --budget SIZE -- python train.py --lr 1e-3")
    assert not (tmp_path / "oom").exists()


def test_bad_arguments_are_one_line_errors(tmp_path):
    from alloctune.integrations.transformers import AlloctuneCallback, alloctune_oom_guard

    (tmp_path / "file").write_text("x")
    cases = [(lambda: OOMRecorder(tmp_path, max_entries=0), "max_entries must be"),
             (lambda: OOMRecorder(tmp_path, stacks="cpp"), "stacks must be one of python, all"),
             (lambda: OOMRecorder(tmp_path / "file"), "is not a directory"),
             (lambda: alloctune_oom_guard(object()).__enter__(), "needs a transformers Trainer, got object")]
    for make, message in cases:
        with pytest.raises(InputError, match=message) as raised:
            make()
        assert "\n" not in str(raised.value)
    trainer = tiny_trainer(tmp_path / "run", [AlloctuneCallback(tmp_path, backend=FakeCuda({}))])
    with pytest.raises(InputError, match="already has an AlloctuneCallback"):
        alloctune_oom_guard(trainer, tmp_path / "elsewhere").__enter__()


def test_a_missing_framework_is_named_with_its_install_line():
    with pytest.raises(EnvironmentProblem, match=r"needs no_such_framework_x, .* pip install no-such") as raised:
        framework_class(("no_such_framework_x",), "Callback", "no-such")
    assert "\n" not in str(raised.value)


def test_the_callback_is_a_trainer_callback_built_once():
    import transformers

    from alloctune.integrations import transformers as hooks

    assert issubclass(hooks.AlloctuneCallback, transformers.TrainerCallback)
    assert hooks.AlloctuneCallback is hooks._callback_class()
    with pytest.raises(AttributeError):
        _ = hooks.NoSuchCallback


def test_lightning_hooks_record_during_fit_and_report_at_on_exception(tmp_path, oom_snapshot):
    """The hooks' behaviour, without Lightning: setup("fit") starts, on_exception reports, never swallows."""
    fake, out = FakeCuda(oom_snapshot), io.StringIO()
    hooks = LightningHooks(tmp_path, backend=fake, stream=out, command=COMMAND)
    hooks.setup(None, None, "validate")
    assert fake.started == []
    hooks.setup(None, None, "fit")
    hooks.on_exception(None, None, KeyboardInterrupt())  # not an OOM: nothing written
    assert out.getvalue() == "" and fake.stopped == 1
    hooks.setup(None, None, "fit")
    assert hooks.on_exception(None, None, torch.OutOfMemoryError("CUDA out of memory.")) is None
    assert out.getvalue().startswith("fragmentation: ") and len(out.getvalue().splitlines()) == 1
    hooks.teardown(None, None, "fit")
    assert len(fake.started) == 2 and fake.stopped == 2


def test_lightning_callback_is_a_lightning_callback():
    lightning = pytest.importorskip("lightning.pytorch", reason="lightning is not installed")
    from alloctune.integrations.lightning import AlloctuneCallback

    assert issubclass(AlloctuneCallback, lightning.Callback)
    assert issubclass(AlloctuneCallback, LightningHooks)


@pytest.mark.gpu
def test_a_real_oom_under_a_cap_on_the_gpu(tmp_path):
    """A Trainer on CUDA under a 1 GiB cap, a callback that keeps 64 MiB per step until the allocator refuses."""
    from transformers import TrainerCallback

    from alloctune.integrations.transformers import AlloctuneCallback, alloctune_oom_guard

    class Hoard(TrainerCallback):
        kept: list[Any] = []

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            for _ in range(8):
                self.kept.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))

    total = torch.cuda.get_device_properties(0).total_memory
    fraction = (1 << 30) / total
    out = io.StringIO()
    callback = AlloctuneCallback(tmp_path / "oom", stream=out, command=COMMAND)
    torch.cuda.set_per_process_memory_fraction(fraction)
    try:
        trainer = tiny_trainer(tmp_path / "run", [Hoard(), callback], device="cuda")
        trainer.args.max_steps = 100
        with pytest.raises(torch.OutOfMemoryError):
            with alloctune_oom_guard(trainer):
                trainer.train()
    finally:
        Hoard.kept.clear()
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines
    note = callback.recorder.notes[0]
    assert note.snapshot is not None and note.snapshot.exists()
    assert lines[0].startswith(f"{note.verdict}: ") and note.verdict != "undiagnosed", lines[0]
    record = run_record(load_snapshot(note.snapshot), str(note.snapshot))
    assert record["cap"] == int(fraction * total) and record["total_memory"] == total
    diagnosis = api.diagnose_snapshot(str(note.snapshot))
    assert diagnosis.budget_source == "recorded cap" and diagnosis.budget == record["cap"]
    assert not callback.recorder.recording
