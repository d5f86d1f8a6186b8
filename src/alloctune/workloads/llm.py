"""LLM serving: a Llama-shaped decoder answering requests of very different sizes.

``transformers``' ``LlamaForCausalLM`` built from a config (Llama-3.2-1B shapes: 16 layers,
hidden 2048, 32 query / 8 KV heads, vocabulary 128,256; no weights downloaded) runs
``generate`` with its growing KV cache. Each request has a prompt length drawn
log-uniformly from 64 to 6000 tokens, 16–64 new tokens and a batch of 1–4: the prefill
activations and the cache grow to a different size every time, which is the serving
pattern that strands cached blocks.

    python -m alloctune.workloads.llm --device cuda --count 10
    python -m alloctune.workloads.llm --tiny --device cpu
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from alloctune.workloads import common

NAME = "llm"

FULL = dict(
    vocab_size=128_256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=131_072,
    rope_theta=500_000.0,
    tie_word_embeddings=True,
)
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)


@dataclass(frozen=True)
class Request:
    batch: int
    prompt: int
    new_tokens: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--min-prompt", type=int, default=None, help="shortest prompt in tokens (default 64, tiny 8)")
    parser.add_argument("--max-prompt", type=int, default=None, help="longest prompt in tokens (default 6000, tiny 64)")
    parser.add_argument("--max-batch", type=int, default=None, help="largest batch (default 4, tiny 2)")


@dataclass
class State:
    model: Any
    requests: list[Request]


def draw_requests(ctx: common.RunContext, lo: int, hi: int, max_batch: int, new_range: tuple[int, int]) -> list[Request]:
    return [
        Request(
            batch=int(ctx.rng.integers(1, max_batch + 1)),
            prompt=common.log_uniform_int(ctx.rng, lo, hi),
            new_tokens=int(ctx.rng.integers(new_range[0], new_range[1] + 1)),
        )
        for _ in range(ctx.count)
    ]


def build(ctx: common.RunContext, args: argparse.Namespace) -> State:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**(TINY if ctx.tiny else FULL), bos_token_id=None, eos_token_id=None, pad_token_id=0)
    with common.building(ctx.device, ctx.dtype):
        model = LlamaForCausalLM(config).eval()
    # Random weights produce arbitrary tokens: no EOS, so every request runs its full length.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    lo = args.min_prompt if args.min_prompt is not None else (8 if ctx.tiny else 64)
    hi = args.max_prompt if args.max_prompt is not None else (64 if ctx.tiny else 6000)
    max_batch = args.max_batch if args.max_batch is not None else (2 if ctx.tiny else 4)
    new_range = (2, 6) if ctx.tiny else (16, 64)
    return State(model=model, requests=draw_requests(ctx, lo, hi, max_batch, new_range))


def items(ctx: common.RunContext, args: argparse.Namespace, state: State) -> Iterator[dict[str, Any]]:
    vocab = state.model.config.vocab_size
    for req in state.requests:
        ids = torch.randint(1, vocab, (req.batch, req.prompt), device=ctx.device)
        mask = torch.ones_like(ids)
        with torch.no_grad():
            out = state.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=req.new_tokens,
                min_new_tokens=req.new_tokens,
                do_sample=False,
            )
        generated = out.shape[1] - req.prompt
        tokens = out.cpu()
        del out, ids, mask, tokens
        yield {
            "batch": req.batch,
            "prompt": req.prompt,
            "new_tokens": generated * req.batch,
            "prompt_tokens": req.prompt * req.batch,
        }


def main(argv: list[str] | None = None) -> common.Summary:
    return common.main(
        NAME,
        __doc__,
        add_arguments,
        build,
        items,
        default_count=10,
        tiny_count=3,
        summed=("new_tokens", "prompt_tokens"),
        argv=argv,
    )


if __name__ == "__main__":
    main()
