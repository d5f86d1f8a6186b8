"""Training programs written with real library code, each remedy written by hand as a flag.

The ground truth of the training remedies: the same program with activation checkpointing,
micro-batches with gradient accumulation or another optimizer written in by its user, so that
a remedy's simulated min budget can be held to the real program's bisected one.

    python bench/train_programs.py bert --batch 32               # transformers BERT-base classifier, AdamW, bf16 autocast
    python bench/train_programs.py encoder --checkpointing        # torch.nn.TransformerEncoderLayer stack, by hand
    python bench/train_programs.py vit --micro-batch 16           # timm ViT-B/16, gradients accumulated over 2
    python bench/train_programs.py bert --optimizer sgd           # SGD with momentum instead of AdamW
    python bench/train_programs.py bert --keep-logits             # a loop that keeps every step's logits (a leak)

Every step: forward, backward (per micro-batch), optimizer step, zero_grad(set_to_none=True).
Inputs vary as in fine-tuning with dynamic padding: sequence lengths 64..512 drawn per sample
(fixed seed), each micro-batch padded to its own longest. `--facts FILE` writes what the process
measured itself: parameter, gradient and optimizer-state bytes (from the tensors), and the peak
allocated bytes of every phase of every step (reset_peak_memory_stats at each phase boundary).
Exit 1 on a CUDA OOM.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

PHASES = ("forward", "backward", "optimizer_step", "zero_grad")


class Encoder(nn.Module):
    """A BERT-large-shaped encoder from torch.nn's own layers, checkpointed block by block by hand."""

    def __init__(self, vocab: int = 32000, d: int = 1024, layers: int = 12, heads: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True,
                                                               norm_first=True) for _ in range(layers))
        self.head = nn.Linear(d, 2)
        self.checkpointing = False

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        pad = ~mask.bool()
        for layer in self.layers:
            if self.checkpointing:
                x = checkpoint(layer, x, None, pad, use_reentrant=False)
            else:
                x = layer(x, src_key_padding_mask=pad)
        return self.head(x[:, 0])


def build(name: str, checkpointing: bool) -> tuple[nn.Module, Callable[..., torch.Tensor], str]:
    """The model on the GPU, its loss on one micro-batch, and the input kind (tokens / images)."""
    if name == "bert":
        from transformers import BertConfig, BertForSequenceClassification

        model = BertForSequenceClassification(BertConfig(num_labels=2)).cuda().train()
        if checkpointing:
            model.gradient_checkpointing_enable()

        def loss_bert(ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return model(input_ids=ids, attention_mask=mask, labels=labels).loss

        return model, loss_bert, "tokens"
    if name == "encoder":
        enc = Encoder().cuda().train()
        enc.checkpointing = checkpointing

        def loss_enc(ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(enc(ids, mask), labels)

        return enc, loss_enc, "tokens"
    if name == "vit":
        import timm

        vit = timm.create_model("vit_base_patch16_224", num_classes=10).cuda().train()
        if checkpointing:
            vit.set_grad_checkpointing(True)

        def loss_vit(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(vit(images), labels)

        return vit, loss_vit, "images"
    raise SystemExit(f"unknown model {name!r}")


def make_optimizer(name: str, params: list[nn.Parameter], foreach: bool | None) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01, foreach=foreach)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=foreach)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-3, foreach=foreach)
    if name == "adamw8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=1e-5, weight_decay=0.01)
    raise SystemExit(f"unknown optimizer {name!r}")


def batches(kind: str, steps: int, batch: int, seed: int) -> list[list[Any]]:
    """Per step, per sample: a sequence length (tokens) or nothing (images: fixed 224x224)."""
    rng = random.Random(seed)
    if kind == "tokens":
        return [[rng.randint(64, 512) for _ in range(batch)] for _ in range(steps)]
    return [[224] * batch for _ in range(steps)]


def micro_inputs(kind: str, sizes: list[int], gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    n = len(sizes)
    labels = torch.randint(0, 2, (n,), generator=gen).cuda()
    if kind == "images":
        return torch.randn(n, 3, 224, 224, generator=gen).cuda(), labels
    longest = max(sizes)
    ids = torch.randint(1000, 30000, (n, longest), generator=gen)
    mask = torch.zeros(n, longest, dtype=torch.long)
    for i, s in enumerate(sizes):
        mask[i, :s] = 1
    return ids.cuda(), mask.cuda(), labels


class Phases:
    """Peak allocated bytes per phase, measured by the process itself at each boundary."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def mark(self, step: int, phase: str) -> None:
        torch.cuda.synchronize()
        self.rows.append({"step": step, "phase": phase, "peak_allocated": torch.cuda.max_memory_allocated(),
                          "allocated_after": torch.cuda.memory_allocated()})
        torch.cuda.reset_peak_memory_stats()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", choices=("bert", "encoder", "vit"))
    ap.add_argument("--batch", type=int, default=None, help="samples per optimizer step (bert/encoder 32, vit 64)")
    ap.add_argument("--micro-batch", type=int, default=None, help="samples per forward/backward (default: --batch)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing of every block")
    ap.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd", "adafactor", "adamw8bit"))
    ap.add_argument("--no-foreach", action="store_true", help="the optimizer's per-tensor loop (foreach=False)")
    ap.add_argument("--keep-logits", action="store_true", help="keep every step's logits on the GPU (a leak)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--facts", default=None, help="write the process's own measurements (JSON) here")
    a = ap.parse_args(argv)
    torch.manual_seed(a.seed)
    model, loss_of, kind = build(a.model, a.checkpointing)
    batch = a.batch or (64 if kind == "images" else 32)
    micro = min(a.micro_batch or batch, batch)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(a.optimizer, params, False if a.no_foreach else None)
    gen = torch.Generator().manual_seed(a.seed)
    phases = Phases()
    kept: list[torch.Tensor] = []
    accum = math.ceil(batch / micro)
    torch.cuda.reset_peak_memory_stats()
    try:
        for step, sizes in enumerate(batches(kind, a.steps, batch, a.seed)):
            for j in range(accum):
                chunk = sizes[j * micro:(j + 1) * micro]
                inputs = micro_inputs(kind, chunk, gen)
                phases.mark(step, "other")
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = loss_of(*inputs) * (len(chunk) / batch)
                if a.keep_logits:
                    kept.append(torch.empty(len(chunk), 1 << 18, device="cuda"))
                phases.mark(step, "forward")
                loss.backward()
                phases.mark(step, "backward")
                del loss, inputs
            opt.step()
            phases.mark(step, "optimizer_step")
            opt.zero_grad(set_to_none=True)
            phases.mark(step, "zero_grad")
    except torch.OutOfMemoryError as exc:
        print(f"OOM: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.is_cuda]
    facts = {
        "model": a.model, "batch": batch, "micro_batch": micro, "accumulation": accum, "steps": a.steps,
        "checkpointing": a.checkpointing, "optimizer": a.optimizer, "foreach": not a.no_foreach,
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "param_count": sum(1 for _ in model.parameters()),
        "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
        "optimizer_state_bytes": sum(t.numel() * t.element_size() for t in state),
        "optimizer_state_tensors": len(state),
        "kept_bytes": sum(t.numel() * t.element_size() for t in kept),
        "peak_allocated": max(r["peak_allocated"] for r in phases.rows),
        "phases": phases.rows,
        "torch": torch.__version__,
    }
    if a.facts:
        with open(a.facts, "w") as f:
            json.dump(facts, f)
    print(f"done: peak_allocated={facts['peak_allocated']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
