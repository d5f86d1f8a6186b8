"""Stable-Diffusion-1.5-shaped text-to-image inference at mixed resolutions.

A UNet with SD 1.5's layout (320/640/1280 channels, two res blocks per level, spatial
transformers with cross-attention to 77×768 text states at the three upper levels,
classifier-free guidance as a batch of two) and the VAE decoder (512/512/256/128
channels), written compactly here (no diffusers dependency). Each item is one image at a
resolution drawn from 512² to 1024², square or not, with a few denoising steps; the
resolution changes are what make this workload fragment the cache (activations at one
size leave holes the next size cannot reuse).

    python -m alloctune.workloads.diffusion --device cuda --count 6
    python -m alloctune.workloads.diffusion --tiny --device cpu
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from alloctune.workloads import common

NAME = "diffusion"

# (height, width) in pixels: SD-1.5 users go from the native 512² up to 1024², often non-square.
RESOLUTIONS: tuple[tuple[int, int], ...] = (
    (512, 512),
    (512, 768),
    (768, 512),
    (640, 640),
    (576, 1024),
    (768, 768),
    (1024, 576),
    (640, 896),
    (896, 640),
    (1024, 768),
    (768, 1024),
    (1024, 1024),
)
TINY_RESOLUTIONS: tuple[tuple[int, int], ...] = ((64, 64), (64, 128), (128, 64), (128, 128))


@dataclass(frozen=True)
class UNetConfig:
    base: int = 320
    mult: tuple[int, ...] = (1, 2, 4, 4)
    layers: int = 2
    attn_levels: tuple[int, ...] = (0, 1, 2)
    heads: int = 8
    context_dim: int = 768
    groups: int = 32
    latent: int = 4

    @property
    def temb(self) -> int:
        return self.base * 4


@dataclass(frozen=True)
class VAEConfig:
    channels: tuple[int, ...] = (128, 256, 512, 512)
    layers: int = 3  # resnets per decoder level (layers_per_block + 1)
    groups: int = 32
    latent: int = 4


TINY_UNET = UNetConfig(base=32, mult=(1, 2, 2, 2), heads=2, context_dim=32, groups=8)
TINY_VAE = VAEConfig(channels=(16, 32, 32, 32), groups=8)


class ResBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, groups: int, temb: int | None):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, c_in, eps=1e-5 if temb else 1e-6)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb, c_out) if temb else None
        self.norm2 = nn.GroupNorm(groups, c_out, eps=1e-5 if temb else 1e-6)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.shortcut = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else None

    def forward(self, x: torch.Tensor, temb: torch.Tensor | None = None) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        if self.time_emb_proj is not None and temb is not None:
            h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return (self.shortcut(x) if self.shortcut is not None else x) + h


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, context_dim: int | None = None):
        super().__init__()
        self.heads = heads
        kv = context_dim or dim
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(kv, dim, bias=False)
        self.to_v = nn.Linear(kv, dim, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        context = x if context is None else context
        b, n, d = x.shape
        q = self.to_q(x).view(b, n, self.heads, -1).transpose(1, 2)
        k = self.to_k(context).view(b, context.shape[1], self.heads, -1).transpose(1, 2)
        v = self.to_v(context).view(b, context.shape[1], self.heads, -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.to_out(out.transpose(1, 2).reshape(b, n, d))


class SpatialTransformer(nn.Module):
    """GroupNorm → 1×1 in → {self-attn, cross-attn to text, GEGLU FF} → 1×1 out, residual."""

    def __init__(self, ch: int, heads: int, context_dim: int, groups: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, ch, eps=1e-6)
        self.proj_in = nn.Conv2d(ch, ch, 1)
        self.norm1 = nn.LayerNorm(ch)
        self.attn1 = Attention(ch, heads)
        self.norm2 = nn.LayerNorm(ch)
        self.attn2 = Attention(ch, heads, context_dim)
        self.norm3 = nn.LayerNorm(ch)
        self.ff_in = nn.Linear(ch, ch * 8)  # GEGLU: value and gate of width 4·ch
        self.ff_out = nn.Linear(ch * 4, ch)
        self.proj_out = nn.Conv2d(ch, ch, 1)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        residual = x
        x = self.proj_in(self.norm(x)).permute(0, 2, 3, 1).reshape(b, h * w, c)
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context) + x
        value, gate = self.ff_in(self.norm3(x)).chunk(2, dim=-1)
        x = self.ff_out(value * F.gelu(gate)) + x
        x = x.reshape(b, h, w, c).permute(0, 3, 1, 2).contiguous()
        return self.proj_out(x) + residual


class Downsample(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Upsample(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class UNet(nn.Module):
    """SD-1.5 UNet: 4 down levels, a mid block, 4 up levels with skip concatenations."""

    def __init__(self, cfg: UNetConfig):
        super().__init__()
        self.cfg = cfg
        chans = [cfg.base * m for m in cfg.mult]
        self.time_1 = nn.Linear(cfg.base, cfg.temb)
        self.time_2 = nn.Linear(cfg.temb, cfg.temb)
        self.conv_in = nn.Conv2d(cfg.latent, cfg.base, 3, padding=1)

        def transformer(ch: int) -> SpatialTransformer:
            return SpatialTransformer(ch, cfg.heads, cfg.context_dim, cfg.groups)

        self.down = nn.ModuleList()
        skips = [cfg.base]
        ch = cfg.base
        for level, out in enumerate(chans):
            for _ in range(cfg.layers):
                attn = transformer(out) if level in cfg.attn_levels else None
                self.down.append(nn.ModuleList([ResBlock(ch, out, cfg.groups, cfg.temb), attn]))
                ch = out
                skips.append(ch)
            if level < len(chans) - 1:
                self.down.append(nn.ModuleList([Downsample(ch)]))
                skips.append(ch)
        self.mid = nn.ModuleList(
            [ResBlock(ch, ch, cfg.groups, cfg.temb), transformer(ch), ResBlock(ch, ch, cfg.groups, cfg.temb)]
        )
        self.up = nn.ModuleList()
        for level in reversed(range(len(chans))):
            out = chans[level]
            for i in range(cfg.layers + 1):
                attn = transformer(out) if level in cfg.attn_levels else None
                self.up.append(nn.ModuleList([ResBlock(ch + skips.pop(), out, cfg.groups, cfg.temb), attn]))
                ch = out
            if level > 0:
                self.up.append(nn.ModuleList([Upsample(ch)]))
        self.norm_out = nn.GroupNorm(cfg.groups, ch)
        self.conv_out = nn.Conv2d(ch, cfg.latent, 3, padding=1)

    def time_embedding(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        half = self.cfg.base // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        args = t.float()[:, None] * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1).to(dtype)
        return self.time_2(F.silu(self.time_1(emb)))

    def forward(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        temb = self.time_embedding(t.expand(x.shape[0]), x.dtype)
        x = self.conv_in(x)
        stack = [x]
        for block in self.down:
            if isinstance(block[0], Downsample):
                x = block[0](x)
            else:
                x = block[0](x, temb)
                if block[1] is not None:
                    x = block[1](x, context)
            stack.append(x)
        x = self.mid[0](x, temb)
        x = self.mid[1](x, context)
        x = self.mid[2](x, temb)
        for block in self.up:
            if isinstance(block[0], Upsample):
                x = block[0](x)
                continue
            x = block[0](torch.cat([x, stack.pop()], dim=1), temb)
            if block[1] is not None:
                x = block[1](x, context)
        return self.conv_out(F.silu(self.norm_out(x)))


class VAEAttention(nn.Module):
    """Single-head attention over all pixels of the VAE's mid block."""

    def __init__(self, ch: int, groups: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, ch, eps=1e-6)
        self.attn = Attention(ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.norm(x).view(b, c, h * w).transpose(1, 2)
        y = self.attn(y).transpose(1, 2).reshape(b, c, h, w)
        return x + y


class VAEDecoder(nn.Module):
    """SD's VAE decoder: latent → 512 ch → mid (res, attn, res) → 4 up levels → RGB."""

    def __init__(self, cfg: VAEConfig):
        super().__init__()
        rev = list(reversed(cfg.channels))
        self.post_quant_conv = nn.Conv2d(cfg.latent, cfg.latent, 1)
        self.conv_in = nn.Conv2d(cfg.latent, rev[0], 3, padding=1)
        self.mid = nn.ModuleList(
            [
                ResBlock(rev[0], rev[0], cfg.groups, None),
                VAEAttention(rev[0], cfg.groups),
                ResBlock(rev[0], rev[0], cfg.groups, None),
            ]
        )
        self.up = nn.ModuleList()
        ch = rev[0]
        for i, out in enumerate(rev):
            for _ in range(cfg.layers):
                self.up.append(ResBlock(ch, out, cfg.groups, None))
                ch = out
            if i < len(rev) - 1:
                self.up.append(Upsample(ch))
        self.norm_out = nn.GroupNorm(cfg.groups, ch, eps=1e-6)
        self.conv_out = nn.Conv2d(ch, 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(self.post_quant_conv(z))
        for layer in self.mid:
            x = layer(x)
        for layer in self.up:
            x = layer(x)
        return self.conv_out(F.silu(self.norm_out(x)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=None, help="denoising steps per image (default 4, tiny 2)")
    parser.add_argument("--guidance", type=float, default=7.5, help="classifier-free guidance scale")


@dataclass
class State:
    unet: UNet
    vae: VAEDecoder
    resolutions: list[tuple[int, int]]
    steps: int
    context_dim: int


def build(ctx: common.RunContext, args: argparse.Namespace) -> State:
    unet_cfg, vae_cfg = (TINY_UNET, TINY_VAE) if ctx.tiny else (UNetConfig(), VAEConfig())
    with common.building(ctx.device, ctx.dtype):
        unet = UNet(unet_cfg).eval()
        vae = VAEDecoder(vae_cfg).eval()
    choices = TINY_RESOLUTIONS if ctx.tiny else RESOLUTIONS
    # A shuffled pass over every resolution (repeated as needed): a few items already mix sizes.
    order = [int(i) for _ in range(-(-ctx.count // len(choices))) for i in ctx.rng.permutation(len(choices))]
    steps = args.steps if args.steps is not None else (2 if ctx.tiny else 4)
    return State(unet, vae, [choices[i] for i in order[: ctx.count]], steps, unet_cfg.context_dim)


@torch.no_grad()
def generate(ctx: common.RunContext, state: State, height: int, width: int, guidance: float) -> torch.Tensor:
    """One image: text states, guided denoising steps (batch 2), VAE decode, copy to CPU."""
    text = torch.randn(2, 77, state.context_dim, device=ctx.device, dtype=ctx.dtype)  # uncond + prompt
    latents = torch.randn(1, 4, height // 8, width // 8, device=ctx.device, dtype=ctx.dtype)
    timesteps = torch.linspace(999, 0, state.steps, device=ctx.device).long()
    for i, t in enumerate(timesteps):
        noise = state.unet(torch.cat([latents] * 2), t.reshape(1), text)
        uncond, cond = noise.chunk(2)
        guided = uncond + guidance * (cond - uncond)
        latents = latents - guided / (state.steps - i + 1)  # a plain Euler-like update
    image = state.vae(latents / 0.18215)
    return (image / 2 + 0.5).clamp(0, 1).cpu().float()


def items(ctx: common.RunContext, args: argparse.Namespace, state: State) -> Iterator[dict[str, Any]]:
    for height, width in state.resolutions:
        image = generate(ctx, state, height, width, args.guidance)
        yield {"height": height, "width": width, "megapixels": image.shape[-1] * image.shape[-2] / 1e6, "steps": state.steps}


def main(argv: list[str] | None = None) -> common.Summary:
    return common.main(
        NAME, __doc__, add_arguments, build, items, default_count=6, tiny_count=2, summed=("megapixels",), argv=argv
    )


if __name__ == "__main__":
    main()
