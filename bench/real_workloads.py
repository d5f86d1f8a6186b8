"""Workloads built from real library code (transformers, timm, torchvision; random weights).

The project's own workloads are replicas; these are the libraries' own model classes, so the
requests the allocator sees (cuDNN/cuBLAS workspaces, SDPA, generate's KV cache) are the ones
users' programs make. Inputs vary in size as in serving: clips of 5–70 s, images of mixed
resolution, prompts of mixed length. `--size S` fixes every item's size instead (audio
seconds, image side, prompt tokens): the capacity-planning recordings use it.

    python bench/real_workloads.py hubert --count 8          # HuBERT-base feature extractor, fp16
    python bench/real_workloads.py timm --size 512           # timm resnet50, batch 4, 512x512
    python bench/real_workloads.py torchvision               # torchvision deeplabv3_resnet50, batch 2
    python bench/real_workloads.py llama --count 6           # transformers Llama decoder, generate()

Prints `throughput: X items/s` and a JSON summary (alloctune.workloads.common); exit 1 on OOM.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Iterator

import torch

from alloctune.workloads import common

SR = 16_000


def _sizes(ctx: common.RunContext, args: argparse.Namespace, lo: int, hi: int, step: int = 1) -> list[int]:
    if args.size is not None:
        return [int(args.size)] * ctx.count
    return [max(lo, common.log_uniform_int(ctx.rng, lo, hi) // step * step) for _ in range(ctx.count)]


def _add(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", type=float, default=None, help="fix every item's size (seconds, side, tokens)")


# ---- HuBERT-base (transformers): a convolutional feature extractor + 12 transformer layers ----
def hubert_build(ctx: common.RunContext, args: argparse.Namespace) -> Any:
    from transformers import HubertConfig, HubertModel

    with common.building(ctx.device, ctx.dtype):
        model = HubertModel(HubertConfig()).eval()
    lo, hi = 5, 70
    if args.size is not None:
        secs = [float(args.size)] * ctx.count
    else:
        secs = [float(ctx.rng.uniform(lo, hi)) for _ in range(ctx.count)]
    return model, secs


def hubert_items(ctx: common.RunContext, args: argparse.Namespace, state: Any) -> Iterator[dict[str, Any]]:
    model, secs = state
    for s in secs:
        x = torch.randn(1, int(s * SR), device=ctx.device, dtype=ctx.dtype)
        with torch.inference_mode():
            out = model(x).last_hidden_state
        frames = out.shape[1]
        del out, x
        yield {"seconds": round(s, 2), "frames": frames}


# ---- timm resnet50: convolutions at mixed resolutions ----
def timm_build(ctx: common.RunContext, args: argparse.Namespace) -> Any:
    import timm

    with common.building(ctx.device, ctx.dtype):
        model = timm.create_model("resnet50", pretrained=False, num_classes=1000).eval()
    return model, _sizes(ctx, args, 224, 640, 32)


def _image_items(ctx: common.RunContext, state: Any, batch: int, head: Any) -> Iterator[dict[str, Any]]:
    model, sides = state
    for side in sides:
        x = torch.randn(batch, 3, side, side, device=ctx.device, dtype=ctx.dtype)
        with torch.inference_mode():
            out = head(model(x))
        shape = tuple(out.shape)
        del out, x
        yield {"side": side, "batch": batch, "out": "x".join(map(str, shape))}


def timm_items(ctx: common.RunContext, args: argparse.Namespace, state: Any) -> Iterator[dict[str, Any]]:
    return _image_items(ctx, state, 4, lambda o: o)


# ---- torchvision deeplabv3_resnet50: dilated convolutions, large activations ----
def tv_build(ctx: common.RunContext, args: argparse.Namespace) -> Any:
    from torchvision.models.segmentation import deeplabv3_resnet50

    with common.building(ctx.device, ctx.dtype):
        model = deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=21, aux_loss=False).eval()
    return model, _sizes(ctx, args, 256, 768, 32)


def tv_items(ctx: common.RunContext, args: argparse.Namespace, state: Any) -> Iterator[dict[str, Any]]:
    return _image_items(ctx, state, 2, lambda o: o["out"])


# ---- transformers Llama decoder: generate() with a growing KV cache ----
LLAMA = dict(vocab_size=32_000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
             num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=8192)


def llama_build(ctx: common.RunContext, args: argparse.Namespace) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**LLAMA, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    with common.building(ctx.device, ctx.dtype):
        model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    prompts = _sizes(ctx, args, 64, 4096)
    fixed = args.size is not None
    reqs = [(1 if fixed else int(ctx.rng.integers(1, 3)), p, 32 if fixed else int(ctx.rng.integers(16, 49)))
            for p in prompts]
    return model, reqs


def llama_items(ctx: common.RunContext, args: argparse.Namespace, state: Any) -> Iterator[dict[str, Any]]:
    model, reqs = state
    for batch, prompt, new in reqs:
        ids = torch.randint(1, LLAMA["vocab_size"], (batch, prompt), device=ctx.device)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False)
        n = int(out.shape[1] - prompt) * batch
        del out, ids
        yield {"batch": batch, "prompt": prompt, "new_tokens": n}


WORKLOADS = {
    "hubert": (hubert_build, hubert_items, 8),
    "timm": (timm_build, timm_items, 8),
    "torchvision": (tv_build, tv_items, 6),
    "llama": (llama_build, llama_items, 6),
}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in WORKLOADS:
        print(f"real_workloads: error: first argument must be one of {', '.join(WORKLOADS)}", file=sys.stderr)
        raise SystemExit(2)
    name = argv.pop(0)
    build, items, count = WORKLOADS[name]
    common.main(name, __doc__, _add, build, items, default_count=count, tiny_count=1, argv=argv)


if __name__ == "__main__":
    main()
