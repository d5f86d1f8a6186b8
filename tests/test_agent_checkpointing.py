"""The agent's checkpointing switch (`alloctune run --checkpointing`), on the CPU with real torch
and transformers modules: what it switches on, and that the model computes the same thing."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from alloctune.agent.checkpointing import enable, install  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def grads(net: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    net.zero_grad(set_to_none=True)
    net(x).square().sum().backward()
    return [p.grad.clone() for p in net.parameters()]


def test_repeated_blocks_run_through_checkpoint_and_compute_the_same() -> None:
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(4, 8)
    before = grads(net, x)
    calls = []
    real = torch.utils.checkpoint.checkpoint

    def counting(*a, **k):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return real(*a, **k)

    torch.utils.checkpoint.checkpoint = counting
    try:
        what = enable(net, torch)
        after = grads(net, x)
    finally:
        torch.utils.checkpoint.checkpoint = real
    assert what == "Net: torch.utils.checkpoint around 3 x Block"
    assert len(calls) == 3  # each block once per forward; the Linear pairs inside are not wrapped
    assert all(torch.allclose(a, b) for a, b in zip(before, after))


def test_a_module_with_nothing_repeated_is_left_alone() -> None:
    assert enable(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), torch) is None


def test_transformers_models_use_their_own_switch() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=100)
    model = transformers.BertForSequenceClassification(cfg).train()
    what = enable(model, torch)
    assert what is not None and what.startswith("BertForSequenceClassification.") and "(transformers)" in what
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def test_the_hook_switches_the_first_model_trained_once() -> None:
    enabled: list[str] = []
    notes: list[str] = []
    net = Net()
    handle = install(torch, enabled, notes.append)
    try:
        with torch.no_grad():
            net(torch.randn(2, 8))  # inference: nothing switched
        assert enabled == []
        net(torch.randn(2, 8)).sum().backward()
        net(torch.randn(2, 8)).sum().backward()
    finally:
        handle.remove()
    assert enabled == ["Net: torch.utils.checkpoint around 3 x Block"] and not notes


def test_run_trial_switches_it_on_in_the_child_and_reports_it(tmp_path) -> None:
    """End to end through the agent loaded by path in a fresh interpreter (a CPU program: the trial's
    outcome is no-cuda, the switch and its report are the same)."""
    import sys

    from alloctune.run.runner import run_trial

    prog = tmp_path / "train.py"
    prog.write_text(
        "import torch\n"
        "class Block(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.a = torch.nn.Linear(8, 8); self.b = torch.nn.Linear(8, 8)\n"
        "    def forward(self, x): return x + self.b(torch.relu(self.a(x)))\n"
        "net = torch.nn.Sequential(Block(), Block(), torch.nn.Linear(8, 2))\n"
        "for _ in range(2):\n"
        "    net(torch.randn(4, 8)).sum().backward()\n")
    on = run_trial([sys.executable, str(prog)], checkpointing=True, capture=tmp_path / "on.log")
    off = run_trial([sys.executable, str(prog)], capture=tmp_path / "off.log")
    assert on.checkpointing == ("Sequential: torch.utils.checkpoint around 2 x Block",)
    assert off.checkpointing is None
