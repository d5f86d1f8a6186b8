"""RVC voice-conversion inference, as the CUDA caching allocator sees it.

Follows RVC's offline pipeline (its ``Pipeline.pipeline``): models resident in
fp16 (synthesizer at model select, HuBERT at the first conversion, RMVPE at the first
pitch extraction); per file the RMVPE pitch model runs on the *whole* padded file first
(unbounded by chunking), the whole pitch curve is uploaded, then per chunk HuBERT → ×2
interpolation → protect blend → synthesizer (relative-attention text encoder, 4-flow
reverse, NSF-HiFiGAN) → copy to CPU → ``torch.cuda.empty_cache()``. Files are cut with
RVC's rule (:mod:`alloctune.workloads.chunking`); audio lengths are drawn log-uniformly from
a few seconds to ten minutes and shaped like speech so cuts land in pauses.

    python -m alloctune.workloads.rvc --device cuda --count 8
    python -m alloctune.workloads.rvc --tiny --device cpu
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from alloctune.workloads import chunking, common
from alloctune.workloads.rvc_models import (
    RMVPE,
    SYNTH_CONFIGS,
    TINY_SYNTH,
    ContentEncoder,
    MelFrontEnd,
    SynthConfig,
    Synthesizer,
)

NAME = "rvc"
F0_MIN, F0_MAX = 50.0, 1100.0
# Tiny runs keep the structure of the cutting rule at a scale a CPU handles in seconds.
TINY_PRESET = chunking.ChunkPreset("tiny", 0.1, 0.4, 2.0, 2.5)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", choices=("v1", "v2"), default="v2", help="model version (default v2)")
    parser.add_argument("--sr", choices=("32k", "40k", "48k"), default="40k", help="target sample rate (default 40k)")
    parser.add_argument(
        "--preset",
        choices=("auto", "fp16", "fp32", "low"),
        default="auto",
        help="chunking preset x_pad/x_query/x_center/x_max; auto picks like RVC from dtype and GPU memory",
    )
    parser.add_argument("--no-empty-cache", action="store_true", help="skip the per-chunk torch.cuda.empty_cache()")
    parser.add_argument("--min-seconds", type=float, default=None, help="shortest file (default 3, tiny 1)")
    parser.add_argument("--max-seconds", type=float, default=None, help="longest file (default 600, tiny 5)")
    parser.add_argument("--protect", type=float, default=0.33, help="RVC's protect (< 0.5 keeps a feature copy)")
    parser.add_argument(
        "--index-rate",
        type=float,
        default=0.0,
        help="> 0 adds RVC's retrieval step: features to CPU, neighbour blend, back to the GPU",
    )
    parser.add_argument("--f0-up-key", type=int, default=0, help="pitch shift in semitones")


@dataclass
class State:
    cfg: SynthConfig
    preset: chunking.ChunkPreset
    synth: Synthesizer
    hubert: ContentEncoder
    lengths: list[float]
    rmvpe: RMVPE | None = None
    mel: MelFrontEnd | None = None
    index_bank: np.ndarray | None = None


def choose_preset(ctx: common.RunContext, name: str) -> chunking.ChunkPreset:
    if ctx.tiny:
        return TINY_PRESET
    if name != "auto":
        return chunking.PRESETS[name]
    total = torch.cuda.get_device_properties(ctx.device).total_memory if ctx.is_cuda else None
    return chunking.preset_for(ctx.half, total)


def build(ctx: common.RunContext, args: argparse.Namespace) -> State:
    cfg = SYNTH_CONFIGS[(args.version, args.sr)]
    if ctx.tiny:
        hub_dim = 32 if args.version == "v2" else 8
        cfg = dataclasses.replace(cfg, **TINY_SYNTH, content_channels=hub_dim)  # hop 32 at "3.2 kHz"
    # RVC moves the synthesizer (at model select) and HuBERT (at the first conversion) to the
    # GPU in fp32 and only then calls .half(): the fp32 copies pass through the cache.
    synth = common.materialize(lambda: Synthesizer(cfg).eval(), ctx.device, ctx.dtype, stage_dtype=torch.float32)
    hubert = common.materialize(
        lambda: ContentEncoder(args.version, tiny=ctx.tiny).eval(), ctx.device, ctx.dtype, stage_dtype=torch.float32
    )
    lo = args.min_seconds if args.min_seconds is not None else (1.0 if ctx.tiny else 3.0)
    hi = args.max_seconds if args.max_seconds is not None else (5.0 if ctx.tiny else 600.0)
    if not 0 < lo <= hi:
        raise SystemExit(f"{NAME}: error: need 0 < --min-seconds <= --max-seconds")
    lengths = [round(float(np.exp(ctx.rng.uniform(np.log(lo), np.log(hi)))), 3) for _ in range(ctx.count)]
    return State(cfg=cfg, preset=choose_preset(ctx, args.preset), synth=synth, hubert=hubert, lengths=lengths)


def decode_f0(salience: np.ndarray, threshold: float = 0.03) -> np.ndarray:
    """RMVPE's salience → Hz: weighted mean of the 9 bins around the peak, in cents (CPU)."""
    cents_map = np.pad(20 * np.arange(360) + 1997.3794084376191, (4, 4))
    center = np.argmax(salience, axis=1) + 4
    padded = np.pad(salience, ((0, 0), (4, 4)))
    idx = center[:, None] + np.arange(-4, 5)[None, :]
    weights = np.take_along_axis(padded, idx, axis=1)
    cents = (weights * cents_map[idx]).sum(1) / np.maximum(weights.sum(1), 1e-9)
    cents[salience.max(axis=1) <= threshold] = 0
    f0 = 10 * 2 ** (cents / 1200)
    f0[f0 == 10] = 0
    # fp16 random weights can overflow; a NaN pitch would index past the pitch embedding.
    return np.nan_to_num(f0, nan=0.0, posinf=0.0, neginf=0.0)


def coarse_pitch(f0: np.ndarray) -> np.ndarray:
    """f0 in Hz → RVC's 1…255 mel-scale bins (the pitch embedding's index)."""
    mel_min, mel_max = (1127 * np.log(1 + f / 700) for f in (F0_MIN, F0_MAX))
    mel = 1127 * np.log(1 + f0 / 700)
    voiced = mel > 0
    mel[voiced] = (mel[voiced] - mel_min) * 254 / (mel_max - mel_min) + 1
    mel = np.clip(mel, 1, 255)
    return np.rint(mel).astype(np.int64)


def extract_pitch(ctx: common.RunContext, state: State, padded: np.ndarray, key: int) -> tuple[np.ndarray, np.ndarray]:
    """RMVPE over the whole padded file (created on first use), decoded on the CPU."""
    if state.rmvpe is None:
        n_mels, base, hidden = (32, 4, 16) if ctx.tiny else (128, 16, 256)
        with common.building(ctx.device, torch.float32):
            state.mel = MelFrontEnd(n_mels=n_mels)  # created (on the device) before the model
        # RVC halves RMVPE on the CPU and then moves it: fp16 weights arrive directly.
        state.rmvpe = common.materialize(lambda: RMVPE(base=base, n_mels=n_mels, gru_hidden=hidden).eval(), ctx.device, ctx.dtype)
    with torch.no_grad():
        audio = torch.from_numpy(padded).float().to(ctx.device).unsqueeze(0)
        mel = state.mel(audio, ctx.dtype)
        salience = _mel_to_salience(state.rmvpe, mel).squeeze(0).cpu().float().numpy()
        del audio, mel
    f0 = decode_f0(salience) * 2 ** (key / 12)
    return coarse_pitch(f0.copy()), f0


def _mel_to_salience(model: RMVPE, mel: torch.Tensor) -> torch.Tensor:
    """RMVPE's ``mel2hidden``: pad frames to a multiple of 32 (the caller's mel stays alive)."""
    n_frames = mel.shape[-1]
    n_pad = 32 * ((n_frames - 1) // 32 + 1) - n_frames
    if n_pad > 0:
        mel = F.pad(mel, (0, n_pad), mode="constant")
    hidden = model(mel)
    return hidden[:, :n_frames]


def convert_chunk(
    ctx: common.RunContext,
    state: State,
    args: argparse.Namespace,
    piece: np.ndarray,
    pitch: torch.Tensor,
    pitchf: torch.Tensor,
    sid: torch.Tensor,
) -> np.ndarray:
    """One chunk through HuBERT and the synthesizer (``Pipeline.vc``).

    Lifetimes follow RVC: the uploaded chunk, its padding mask, HuBERT's output, the protect
    copy and mask stay referenced until this function returns, i.e. after ``empty_cache()``,
    so their blocks go back to the cache only then and are still cached when the next chunk
    starts.
    """
    feats = torch.from_numpy(piece).to(ctx.dtype).view(1, -1)
    padding_mask = torch.zeros(feats.shape, dtype=torch.bool).to(ctx.device)
    # RVC keeps the uploaded chunk and the (all-False) padding mask in its `inputs` dict.
    inputs = {"source": feats.to(ctx.device), "padding_mask": padding_mask}
    with torch.no_grad():
        hidden = state.hubert.encode(inputs["source"])
        feats = state.hubert.project(hidden)
    protect = args.protect < 0.5
    if protect:
        feats0 = feats.clone()
    if args.index_rate > 0:
        npy = feats[0].cpu().float().numpy()
        bank = state.index_bank
        if bank is None or bank.shape[1] != npy.shape[1]:
            bank = state.index_bank = ctx.rng.standard_normal((2048, npy.shape[1])).astype(np.float32)
        neighbours = ctx.rng.integers(0, len(bank), size=(len(npy), 8))
        npy = bank[neighbours].mean(axis=1).astype(np.float16 if ctx.half else np.float32)
        feats = torch.from_numpy(npy).unsqueeze(0).to(ctx.device) * args.index_rate + (1 - args.index_rate) * feats
    feats = F.interpolate(feats.permute(0, 2, 1), scale_factor=2).permute(0, 2, 1)
    if protect:
        feats0 = F.interpolate(feats0.permute(0, 2, 1), scale_factor=2).permute(0, 2, 1)
    p_len = len(piece) // chunking.WINDOW
    if feats.shape[1] < p_len:
        p_len = feats.shape[1]
        pitch, pitchf = pitch[:, :p_len], pitchf[:, :p_len]
    if protect:
        pitchff = pitchf.clone()
        pitchff[pitchf > 0] = 1
        pitchff[pitchf < 1] = args.protect
        pitchff = pitchff.unsqueeze(-1)
        feats = feats * pitchff + feats0 * (1 - pitchff)  # a float32 temporary, as in RVC
        feats = feats.to(feats0.dtype)
    lengths = torch.tensor([p_len], device=ctx.device).long()
    with torch.no_grad():
        out = state.synth.infer(feats, lengths, pitch, pitchf, sid)[0, 0].data.cpu().float().numpy()
    del feats, lengths, padding_mask
    if ctx.is_cuda and not args.no_empty_cache:
        torch.cuda.empty_cache()
    return out


def convert_file(ctx: common.RunContext, state: State, args: argparse.Namespace, audio: np.ndarray) -> dict[str, Any]:
    """One file: cut (CPU) → whole-file pitch (GPU) → every chunk → reassembled output."""
    preset = state.preset
    plan = chunking.plan_chunks(audio, preset)
    padded = chunking.pad_audio(audio, preset)
    sid = torch.tensor([0], device=ctx.device).long()
    coarse, f0 = extract_pitch(ctx, state, padded, args.f0_up_key)
    p_len = plan.pitch_frames
    pitch = torch.tensor(coarse[:p_len], device=ctx.device).unsqueeze(0).long()
    pitchf = torch.tensor(f0[:p_len].astype(np.float32), device=ctx.device).unsqueeze(0).float()
    outputs = []
    for chunk in plan.chunks:
        f_end = chunk.f_end if chunk.f_end is not None else p_len
        out = convert_chunk(
            ctx,
            state,
            args,
            padded[chunk.start : chunk.end],
            pitch[:, chunk.f_start : f_end],
            pitchf[:, chunk.f_start : f_end],
            sid,
        )
        outputs.append(chunking.trim(out, state.cfg.sr, preset))
    result = np.concatenate(outputs)
    expected = chunking.output_length(plan, state.cfg.hop, state.cfg.sr)
    if len(result) != expected:  # RVC's frame arithmetic (chunking.py) must hold
        raise RuntimeError(f"output has {len(result)} samples, the chunk plan predicts {expected}")
    del pitch, pitchf, sid
    if ctx.is_cuda and not args.no_empty_cache:
        torch.cuda.empty_cache()
    return {
        "audio_s": len(audio) / chunking.SAMPLE_RATE,
        "chunks": len(plan.chunks),
        "output_s": len(result) / state.cfg.sr,
    }


def items(ctx: common.RunContext, args: argparse.Namespace, state: State) -> Iterator[dict[str, Any]]:
    for seconds in state.lengths:
        audio = chunking.speech_like(ctx.rng, seconds)
        yield convert_file(ctx, state, args, audio)


def main(argv: list[str] | None = None) -> common.Summary:
    return common.main(
        NAME, __doc__, add_arguments, build, items, default_count=8, tiny_count=2, summed=("audio_s", "chunks"), argv=argv
    )


if __name__ == "__main__":
    main()
