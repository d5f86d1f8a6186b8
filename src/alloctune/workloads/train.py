"""Training: a GPT-like model trained with AdamW on variable sequence lengths and batches.

A GPT-2-small-shaped decoder (12 layers, width 768, 12 heads, vocabulary 50,257, tied
embeddings) with fp32 master weights, autocast to fp16 with a gradient scaler on CUDA,
and AdamW. Every step draws a sequence length (64–1024) and a batch size (1–16) under a
token budget, like packing-free training on a corpus of documents of uneven length: the
activation and gradient blocks change size every step, on top of the optimizer's
long-lived state.

    python -m alloctune.workloads.train --device cuda --count 40
    python -m alloctune.workloads.train --tiny --device cpu
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from alloctune.workloads import common

NAME = "train"


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 50_257
    context: int = 1024
    width: int = 768
    layers: int = 12
    heads: int = 12


TINY_GPT = GPTConfig(vocab=256, context=64, width=32, layers=2, heads=2)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.ln_1 = nn.LayerNorm(cfg.width)
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.ln_2 = nn.LayerNorm(cfg.width)
        self.fc = nn.Linear(cfg.width, 4 * cfg.width)
        self.fc_proj = nn.Linear(4 * cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.width)
        self.wpe = nn.Embedding(cfg.context, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.width)
        # GPT-2's small embedding init keeps fp16 logits finite; with inf losses the scaler
        # would skip optimizer steps and AdamW's state would appear late or never.
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.02)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied output head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=None, help="tokens per step at most (default 8192, tiny 128)")
    parser.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate")


@dataclass
class State:
    model: GPT
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    shapes: list[tuple[int, int]]


def draw_shapes(ctx: common.RunContext, context: int, max_tokens: int) -> list[tuple[int, int]]:
    """(batch, seq_len) per step: length log-uniform up to the context, batch fills the budget."""
    shapes = []
    shortest = min(64, context)
    for _ in range(ctx.count):
        seq = min(context, common.log_uniform_int(ctx.rng, shortest, context))
        batch = int(ctx.rng.integers(1, max(1, min(16, max_tokens // seq)) + 1))
        shapes.append((batch, seq))
    return shapes


def build(ctx: common.RunContext, args: argparse.Namespace) -> State:
    cfg = TINY_GPT if ctx.tiny else GPTConfig()
    with common.building(ctx.device, torch.float32):  # master weights stay fp32; fp16 is autocast
        model = GPT(cfg).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    scaler = torch.amp.GradScaler("cuda") if ctx.is_cuda and ctx.half else None
    max_tokens = args.max_tokens if args.max_tokens is not None else (128 if ctx.tiny else 8192)
    return State(model, optimizer, scaler, draw_shapes(ctx, cfg.context, max_tokens))


def items(ctx: common.RunContext, args: argparse.Namespace, state: State) -> Iterator[dict[str, Any]]:
    vocab = state.model.cfg.vocab
    for batch, seq in state.shapes:
        ids = torch.randint(0, vocab, (batch, seq + 1), device=ctx.device)
        with torch.autocast(ctx.device.type, dtype=torch.float16, enabled=ctx.half):
            loss = state.model(ids[:, :-1], ids[:, 1:])
        if state.scaler is not None:
            state.scaler.scale(loss).backward()
            state.scaler.step(state.optimizer)
            state.scaler.update()
        else:
            loss.backward()
            state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
        value = float(loss.item())
        del loss, ids
        yield {"batch": batch, "seq": seq, "tokens": batch * seq, "loss": round(value, 4)}


def main(argv: list[str] | None = None) -> common.Summary:
    return common.main(NAME, __doc__, add_arguments, build, items, default_count=40, tiny_count=3, summed=("tokens",), argv=argv)


if __name__ == "__main__":
    main()
