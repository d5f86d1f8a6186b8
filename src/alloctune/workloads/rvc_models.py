"""Shape-faithful, weight-free replicas of the networks RVC runs at inference.

Written from RVC's published architecture (layer sizes, orders, which convs are
weight-normed); no RVC code is reused. What matters for the
allocator is that every intermediate tensor has RVC's shape and dtype and is created and
freed in the same order, so the forward passes keep RVC's operator sequence (for example
the relative-attention pad/reshape dance, the old-style ``weight_norm`` hooks that
recompute weights on every call, float32 pitch and sine sources inside an fp16 model) and
its variable lifetimes: where RVC keeps an intermediate in a local until the next
assignment or the function's return, so does this code (that decides when a block is
freed, hence which cached block the next request can reuse).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# ---------------------------------------------------------------------------------------
# Synthesizer configurations (checkpoint `config` lists; v2-40k uses the v1 40k json).


@dataclass(frozen=True)
class SynthConfig:
    version: str  # "v1" (256-dim content) or "v2" (768-dim)
    sr: int
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    inter_channels: int = 192
    hidden_channels: int = 192
    filter_channels: int = 768
    n_heads: int = 2
    n_layers: int = 6
    kernel_size: int = 3
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilations: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    upsample_initial_channel: int = 512
    spk_embed_dim: int = 109
    gin_channels: int = 256
    window_size: int = 10
    content_channels: int = 0  # 0: the version's (768 for v2, 256 for v1)

    @property
    def content_dim(self) -> int:
        if self.content_channels:
            return self.content_channels
        return 768 if self.version == "v2" else 256

    @property
    def hop(self) -> int:
        return math.prod(self.upsample_rates)


SYNTH_CONFIGS: dict[tuple[str, str], SynthConfig] = {
    ("v1", "32k"): SynthConfig("v1", 32000, (10, 4, 2, 2, 2), (16, 16, 4, 4, 4)),
    ("v1", "40k"): SynthConfig("v1", 40000, (10, 10, 2, 2), (16, 16, 4, 4)),
    ("v1", "48k"): SynthConfig("v1", 48000, (10, 6, 2, 2, 2), (16, 16, 4, 4, 4)),
    ("v2", "32k"): SynthConfig("v2", 32000, (10, 8, 2, 2), (20, 16, 4, 4)),
    ("v2", "40k"): SynthConfig("v2", 40000, (10, 10, 2, 2), (16, 16, 4, 4)),
    ("v2", "48k"): SynthConfig("v2", 48000, (12, 10, 2, 2), (24, 20, 4, 4)),
}

# Tiny variant for CPU tests: same structure (4 upsampling stages, hop = sr / 100), a
# fraction of the widths and a 32-sample hop so the decoder is cheap on a CPU.
TINY_SYNTH = dict(
    sr=3200,
    upsample_rates=(4, 2, 2, 2),
    upsample_kernel_sizes=(8, 4, 4, 4),
    inter_channels=16,
    hidden_channels=16,
    filter_channels=32,
    n_layers=2,
    upsample_initial_channel=32,
    gin_channels=16,
    spk_embed_dim=4,
)


def _weight_norm(module: nn.Module) -> nn.Module:
    """RVC keeps the hook-based weight norm at inference, so weights are rebuilt per call."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.nn.utils.weight_norm(module)


# ---------------------------------------------------------------------------------------
# Text encoder with VITS-style relative-position attention.


class ChannelLayerNorm(nn.Module):
    """LayerNorm over the channel axis of a ``[B, C, T]`` tensor (transpose in and out)."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, -1)
        x = F.layer_norm(x, (x.shape[-1],), self.gamma, self.beta, self.eps)
        return x.transpose(1, -1)


class RelativeAttention(nn.Module):
    """Multi-head self-attention with windowed relative position keys and values.

    The relative↔absolute conversions pad and reshape through ``[B, H, T, 2T]``-sized
    buffers; with the ``[B, H, T, T]`` scores these are the quadratic blocks that dominate a
    long chunk's memory.
    """

    def __init__(self, channels: int, n_heads: int, window_size: int):
        super().__init__()
        self.n_heads = n_heads
        self.k_channels = channels // n_heads
        self.window_size = window_size
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, channels, 1)
        scale = self.k_channels**-0.5
        self.emb_rel_k = nn.Parameter(torch.randn(1, 2 * window_size + 1, self.k_channels) * scale)
        self.emb_rel_v = nn.Parameter(torch.randn(1, 2 * window_size + 1, self.k_channels) * scale)

    def _relative_embeddings(self, table: torch.Tensor, length: int) -> torch.Tensor:
        pad = max(length - (self.window_size + 1), 0)
        first = max((self.window_size + 1) - length, 0)
        if pad > 0:
            table = F.pad(table, [0, 0, pad, pad, 0, 0])
        return table[:, first : first + 2 * length - 1]

    @staticmethod
    def _rel_to_abs(x: torch.Tensor) -> torch.Tensor:
        b, h, n, _ = x.shape
        x = F.pad(x, [0, 1])
        flat = F.pad(x.view(b, h, n * 2 * n), [0, n - 1])
        return flat.view(b, h, n + 1, 2 * n - 1)[:, :, :n, n - 1 :]

    @staticmethod
    def _abs_to_rel(x: torch.Tensor) -> torch.Tensor:
        b, h, n, _ = x.shape
        x = F.pad(x, [0, n - 1])
        flat = F.pad(x.view(b, h, n * n + n * (n - 1)), [n, 0])
        return flat.view(b, h, n, 2 * n)[:, :, :, 1:]

    def _attention(self, query, key, value, mask):
        b, d, t = key.shape
        query = query.view(b, self.n_heads, self.k_channels, t).transpose(2, 3)
        key = key.view(b, self.n_heads, self.k_channels, t).transpose(2, 3)
        value = value.view(b, self.n_heads, self.k_channels, t).transpose(2, 3)
        scores = torch.matmul(query / math.sqrt(self.k_channels), key.transpose(-2, -1))
        key_rel = self._relative_embeddings(self.emb_rel_k, t)
        rel_logits = torch.matmul(query / math.sqrt(self.k_channels), key_rel.unsqueeze(0).transpose(-2, -1))
        scores_local = self._rel_to_abs(rel_logits)
        scores = scores + scores_local
        scores = scores.masked_fill(mask == 0, -1e4)
        p_attn = F.softmax(scores, dim=-1)
        output = torch.matmul(p_attn, value)
        relative_weights = self._abs_to_rel(p_attn)
        value_rel = self._relative_embeddings(self.emb_rel_v, t)
        output = output + torch.matmul(relative_weights, value_rel.unsqueeze(0))
        output = output.transpose(2, 3).contiguous().view(b, d, t)
        return output, p_attn

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q = self.conv_q(x)
        k = self.conv_k(x)
        v = self.conv_v(x)
        x, _ = self._attention(q, k, v, mask)  # the weights stay referenced until return, as in RVC
        return self.conv_o(x)


class FFN(nn.Module):
    def __init__(self, channels: int, filter_channels: int, kernel_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size)

    def _same(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, [(self.kernel_size - 1) // 2, self.kernel_size // 2])

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv_1(self._same(x * mask)))
        x = self.conv_2(self._same(x * mask))
        return x * mask


def _sequence_mask(lengths: torch.Tensor, t: int) -> torch.Tensor:
    steps = torch.arange(t, dtype=lengths.dtype, device=lengths.device)
    return steps.unsqueeze(0) < lengths.unsqueeze(1)


class TextEncoder(nn.Module):
    """``enc_p``: content + coarse pitch embedding → 6 post-LN relative-attention layers → stats."""

    def __init__(self, cfg: SynthConfig):
        super().__init__()
        h = cfg.hidden_channels
        self.hidden = h
        self.out_channels = cfg.inter_channels
        self.emb_phone = nn.Linear(cfg.content_dim, h)
        self.emb_pitch = nn.Embedding(256, h)
        self.encoder = AttentionEncoder(cfg)
        self.proj = nn.Conv1d(h, cfg.inter_channels * 2, 1)

    def forward(self, phone: torch.Tensor, pitch: torch.Tensor, lengths: torch.Tensor):
        x = self.emb_phone(phone)
        x = x + self.emb_pitch(pitch)
        x = x * math.sqrt(self.hidden)
        x = F.leaky_relu(x, 0.1, inplace=True)  # RVC's LeakyReLU here is in place
        x = torch.transpose(x, 1, -1)
        t = x.shape[2]
        x_mask = torch.unsqueeze(_sequence_mask(lengths, t), 1).to(x.dtype)
        # Called as a module: the masked input stays referenced (by the call's argument tuple)
        # until the encoder returns, as in RVC.
        x = self.encoder(x * x_mask, x_mask)
        stats = self.proj(x) * x_mask
        m, logs = torch.split(stats, self.out_channels, dim=1)
        return m, logs, x_mask


class AttentionEncoder(nn.Module):
    """``attentions.Encoder``: post-LN relative-attention layers; `y` lives until reassigned."""

    def __init__(self, cfg: SynthConfig):
        super().__init__()
        h = cfg.hidden_channels
        self.attn_layers = nn.ModuleList(RelativeAttention(h, cfg.n_heads, cfg.window_size) for _ in range(cfg.n_layers))
        self.norm_layers_1 = nn.ModuleList(ChannelLayerNorm(h) for _ in range(cfg.n_layers))
        self.ffn_layers = nn.ModuleList(FFN(h, cfg.filter_channels, cfg.kernel_size) for _ in range(cfg.n_layers))
        self.norm_layers_2 = nn.ModuleList(ChannelLayerNorm(h) for _ in range(cfg.n_layers))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        attn_mask = x_mask.unsqueeze(2) * x_mask.unsqueeze(-1)
        x = x * x_mask
        for attn, norm1, ffn, norm2 in zip(self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2):
            y = attn(x, attn_mask)
            x = norm1(x + y)
            y = ffn(x, x_mask)
            x = norm2(x + y)
        x = x * x_mask
        return x


# ---------------------------------------------------------------------------------------
# Flow: 4 mean-only residual coupling layers with WaveNet cores, run in reverse.


def _gated(a: torch.Tensor, b: torch.Tensor, n: int) -> torch.Tensor:
    """WaveNet's gate, tanh(a+b)[:n] · sigmoid(a+b)[n:].

    RVC runs this as a TorchScript function, whose interpreter frees the sum right after its
    last use; the ``del`` gives eager mode the same lifetimes.
    """
    in_act = a + b
    t_act = torch.tanh(in_act[:, :n, :])
    s_act = torch.sigmoid(in_act[:, n:, :])
    del in_act
    return t_act * s_act


class WN(nn.Module):
    def __init__(self, hidden: int, kernel_size: int, n_layers: int, gin_channels: int):
        super().__init__()
        self.hidden = hidden
        self.n_layers = n_layers
        self.cond_layer = _weight_norm(nn.Conv1d(gin_channels, 2 * hidden * n_layers, 1))
        self.in_layers = nn.ModuleList(
            _weight_norm(nn.Conv1d(hidden, 2 * hidden, kernel_size, padding=(kernel_size - 1) // 2)) for _ in range(n_layers)
        )
        self.res_skip_layers = nn.ModuleList(
            _weight_norm(nn.Conv1d(hidden, 2 * hidden if i < n_layers - 1 else hidden, 1)) for i in range(n_layers)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        h = self.hidden
        output = torch.zeros_like(x)
        width = torch.IntTensor([h])  # RVC hands the width to its TorchScript gate as a CPU tensor
        g = self.cond_layer(g)
        for i in range(self.n_layers):
            x_in = self.in_layers[i](x)
            g_l = g[:, i * 2 * h : (i + 1) * 2 * h, :]
            acts = _gated(x_in, g_l, int(width[0]))
            res_skip = self.res_skip_layers[i](acts)
            if i < self.n_layers - 1:
                # a named view: it keeps this round's res_skip alive through the next round
                res_acts = res_skip[:, :h, :]
                x = (x + res_acts) * mask
                output = output + res_skip[:, h:, :]
            else:
                output = output + res_skip
        return output * mask


class CouplingLayer(nn.Module):
    def __init__(self, channels: int, hidden: int, gin_channels: int):
        super().__init__()
        self.half = channels // 2
        self.pre = nn.Conv1d(self.half, hidden, 1)
        self.enc = WN(hidden, 5, 3, gin_channels)
        self.post = nn.Conv1d(hidden, self.half, 1)

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x0, x1 = torch.split(x, [self.half, self.half], 1)
        h = self.pre(x0) * mask
        h = self.enc(h, mask, g)
        m = self.post(h) * mask
        logs = torch.zeros_like(m)
        x1 = (x1 - m) * torch.exp(-logs) * mask
        x = torch.cat([x0, x1], 1)
        return x, torch.zeros([1])  # RVC returns a (CPU) placeholder log-determinant too


class Flow(nn.Module):
    def __init__(self, cfg: SynthConfig, n_flows: int = 4):
        super().__init__()
        self.flows = nn.ModuleList(
            CouplingLayer(cfg.inter_channels, cfg.hidden_channels, cfg.gin_channels) for _ in range(n_flows)
        )

    @staticmethod
    def _flip(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.flip(x, [1])
        return x, torch.zeros([1], device=x.device)  # RVC's Flip also returns a 1-element "logdet"

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        for layer in reversed(self.flows):
            x, _ = self._flip(x)  # the Flip that follows each coupling layer, undone first
            x, _ = layer.reverse(x, mask, g)
        return x


# ---------------------------------------------------------------------------------------
# NSF-HiFiGAN decoder.


class ResBlock1(nn.Module):
    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs1 = nn.ModuleList(
            _weight_norm(nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=(kernel_size * d - d) // 2))
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            _weight_norm(nn.Conv1d(channels, channels, kernel_size, padding=(kernel_size - 1) // 2)) for _ in dilations
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2 in zip(self.convs1, self.convs2):
            xt = F.leaky_relu(x, 0.1)
            xt = c1(xt)
            xt = F.leaky_relu(xt, 0.1)
            xt = c2(xt)
            x = xt + x  # xt stays referenced into the next round, as in RVC
        return x


class SineSource(nn.Module):
    """NSF source: a float32 sine at the frame's f0 plus noise, merged by Linear(1→1) + tanh.

    Phases are computed per frame as ``[B, T, hop]`` (a cumulative sum over frames only) and
    reshaped to sample rate, the way the 2024 SineGen does it.
    """

    def __init__(self, sr: int, sine_amp: float = 0.1, noise_std: float = 0.003):
        super().__init__()
        self.sr = sr
        self.sine_amp = sine_amp
        self.noise_std = noise_std
        self.l_linear = nn.Linear(1, 1)

    def _sines(self, f0: torch.Tensor, upp: int) -> torch.Tensor:
        steps = torch.arange(1, upp + 1, dtype=f0.dtype, device=f0.device)
        rad = f0 / self.sr * steps  # [B, T, upp]: phase advance within each frame
        carry = torch.fmod(rad[:, :-1, -1:].float() + 0.5, 1.0) - 0.5
        carry = carry.cumsum(dim=1).fmod(1.0).to(f0)
        rad += F.pad(carry, (0, 0, 1, 0))
        rad = rad.reshape(f0.shape[0], -1, 1)
        start = torch.rand(1, 1, 1, device=f0.device)
        start[..., 0] = 0  # the fundamental starts at phase 0 (harmonics would start at random)
        rad += start
        return torch.sin(2 * math.pi * rad)

    def _sine_gen(self, f0: torch.Tensor, upp: int):
        with torch.no_grad():
            f0 = f0.float().unsqueeze(-1)
            sine_waves = self._sines(f0, upp) * self.sine_amp
            uv = (f0 > 0).float()
            uv = F.interpolate(uv.transpose(2, 1), scale_factor=float(upp), mode="nearest").transpose(2, 1)
            noise_amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
            noise = noise_amp * torch.randn_like(sine_waves)
            sine_waves = sine_waves * uv + noise
        return sine_waves, uv, noise

    def forward(self, f0: torch.Tensor, upp: int) -> torch.Tensor:
        sine_wavs, uv, _ = self._sine_gen(f0, upp)
        sine_wavs = sine_wavs.to(dtype=self.l_linear.weight.dtype)
        return torch.tanh(self.l_linear(sine_wavs))


class GeneratorNSF(nn.Module):
    def __init__(self, cfg: SynthConfig):
        super().__init__()
        self.num_kernels = len(cfg.resblock_kernel_sizes)
        self.upp = cfg.hop
        self.m_source = SineSource(cfg.sr)
        self.conv_pre = nn.Conv1d(cfg.inter_channels, cfg.upsample_initial_channel, 7, padding=3)
        self.cond = nn.Conv1d(cfg.gin_channels, cfg.upsample_initial_channel, 1)
        self.ups = nn.ModuleList()
        self.noise_convs = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        rates = cfg.upsample_rates
        channels = cfg.upsample_initial_channel
        for i, (u, k) in enumerate(zip(rates, cfg.upsample_kernel_sizes)):
            c_in, c_out = channels // 2**i, channels // 2 ** (i + 1)
            self.ups.append(_weight_norm(nn.ConvTranspose1d(c_in, c_out, k, u, padding=(k - u) // 2)))
            if i + 1 < len(rates):
                s = math.prod(rates[i + 1 :])
                self.noise_convs.append(nn.Conv1d(1, c_out, kernel_size=2 * s, stride=s, padding=s // 2))
            else:
                self.noise_convs.append(nn.Conv1d(1, c_out, kernel_size=1))
            for kr, dil in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilations):
                self.resblocks.append(ResBlock1(c_out, kr, dil))
        self.conv_post = nn.Conv1d(channels // 2 ** len(rates), 1, 7, padding=3, bias=False)

    def forward(self, x: torch.Tensor, f0: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        har = self.m_source(f0, self.upp).transpose(1, 2)
        x = self.conv_pre(x)
        x = x + self.cond(g)
        for i, (up, noise_conv) in enumerate(zip(self.ups, self.noise_convs)):
            x = F.leaky_relu(x, 0.1)
            x = up(x)
            x_source = noise_conv(har)  # referenced until the next stage replaces it, as in RVC
            x = x + x_source
            xs = None
            for j in range(self.num_kernels):
                if xs is None:
                    xs = self.resblocks[i * self.num_kernels + j](x)
                else:
                    xs += self.resblocks[i * self.num_kernels + j](x)
            x = xs / self.num_kernels
        x = F.leaky_relu(x)
        x = self.conv_post(x)
        x = torch.tanh(x)
        return x


class Synthesizer(nn.Module):
    """``SynthesizerTrnMs{256,768}NSFsid`` without ``enc_q`` (RVC deletes it before inference)."""

    def __init__(self, cfg: SynthConfig):
        super().__init__()
        self.cfg = cfg
        self.emb_g = nn.Embedding(cfg.spk_embed_dim, cfg.gin_channels)
        self.enc_p = TextEncoder(cfg)
        self.flow = Flow(cfg)
        self.dec = GeneratorNSF(cfg)

    @torch.no_grad()
    def infer(self, phone, phone_lengths, pitch, nsff0, sid) -> torch.Tensor:
        g = self.emb_g(sid).unsqueeze(-1)
        m_p, logs_p, x_mask = self.enc_p(phone, pitch, phone_lengths)
        z_p = (m_p + torch.exp(logs_p) * torch.randn_like(m_p) * 0.66666) * x_mask
        z = self.flow.reverse(z_p, x_mask, g)
        return self.dec(z * x_mask, nsff0, g)


# ---------------------------------------------------------------------------------------
# RMVPE pitch model: mel → deep U-Net → BiGRU → 360-bin salience.


class ConvBlockRes(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, 1, 1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(),
            nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(),
        )
        self.shortcut = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) + (self.shortcut(x) if self.shortcut is not None else x)


class ResEncoderBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, pool: bool, n_blocks: int = 4):
        super().__init__()
        self.conv = nn.ModuleList([ConvBlockRes(c_in, c_out)] + [ConvBlockRes(c_out, c_out) for _ in range(n_blocks - 1)])
        self.pool = nn.AvgPool2d(2) if pool else None

    def forward(self, x: torch.Tensor):
        for block in self.conv:
            x = block(x)
        return x if self.pool is None else (x, self.pool(x))


class ResDecoderBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, n_blocks: int = 4):
        super().__init__()
        self.conv1 = nn.Sequential(
            nn.ConvTranspose2d(c_in, c_out, 3, 2, padding=1, output_padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(),
        )
        self.conv2 = nn.ModuleList([ConvBlockRes(c_out * 2, c_out)] + [ConvBlockRes(c_out, c_out) for _ in range(n_blocks - 1)])

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        x = torch.cat((self.conv1(x), skip), dim=1)
        for block in self.conv2:
            x = block(x)
        return x


class UNetEncoder(nn.Module):
    def __init__(self, chans: list[int]):
        super().__init__()
        self.bn = nn.BatchNorm2d(1)
        self.layers = nn.ModuleList(ResEncoderBlock(c_in, c_out, True) for c_in, c_out in zip([1] + chans[:-1], chans))

    def forward(self, x: torch.Tensor):
        skips = []
        x = self.bn(x)
        for layer in self.layers:
            skip, x = layer(x)
            skips.append(skip)
        return x, skips


class UNetIntermediate(nn.Module):
    def __init__(self, c_in: int, c_out: int, n: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(
            [ResEncoderBlock(c_in, c_out, False)] + [ResEncoderBlock(c_out, c_out, False) for _ in range(n - 1)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class UNetDecoder(nn.Module):
    def __init__(self, chans_in: list[int]):
        super().__init__()
        self.layers = nn.ModuleList(ResDecoderBlock(c_in, c_in // 2) for c_in in chans_in)

    def forward(self, x: torch.Tensor, skips: list[torch.Tensor]) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, skips[-1 - i])
        return x


class DeepUNet(nn.Module):
    """Encoder → intermediate → decoder. Each part is a module called with its input, so the
    input stays referenced until that part returns, as in RVC (it decides when blocks free)."""

    def __init__(self, base: int, levels: int):
        super().__init__()
        chans = [base * 2**i for i in range(levels)]  # 16, 32, 64, 128, 256
        top = chans[-1] * 2
        self.encoder = UNetEncoder(chans)
        self.intermediate = UNetIntermediate(chans[-1], top)
        self.decoder = UNetDecoder([top] + chans[::-1][:-1])  # 512, 256, 128, 64, 32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, skips = self.encoder(x)
        x = self.intermediate(x)
        x = self.decoder(x, skips)
        return x


class BiGRU(nn.Module):
    def __init__(self, n_in: int, hidden: int):
        super().__init__()
        self.gru = nn.GRU(n_in, hidden, num_layers=1, batch_first=True, bidirectional=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(x)[0]


class RMVPE(nn.Module):
    """``E2E(4, 1, (2, 2))``: 5-level encoder (16…256 ch), 4 intermediate blocks, 5-level
    decoder, then a 3-channel conv, a BiGRU and a 360-bin sigmoid head."""

    def __init__(self, base: int = 16, levels: int = 5, n_mels: int = 128, gru_hidden: int = 256):
        super().__init__()
        self.n_mels = n_mels
        self.unet = DeepUNet(base, levels)
        self.cnn = nn.Conv2d(base, 3, 3, padding=1)
        self.fc = nn.Sequential(BiGRU(3 * n_mels, gru_hidden), nn.Linear(2 * gru_hidden, 360), nn.Dropout(0.25), nn.Sigmoid())

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        mel = mel.transpose(-1, -2).unsqueeze(1)
        x = self.cnn(self.unet(mel)).transpose(1, 2).flatten(-2)
        x = self.fc(x)
        return x


class MelFrontEnd(nn.Module):
    """RMVPE's log-mel: float32 centred STFT (n_fft 1024, hop 160) → 128 mel bands → model dtype.

    The mel basis only needs its ``[128, 513]`` shape here; the Hann window is made lazily
    on the first call and cached, as RMVPE does.
    """

    def __init__(self, n_mels: int = 128, n_fft: int = 1024, hop: int = 160):
        super().__init__()
        self.n_fft = n_fft
        self.hop = hop
        self.register_buffer("mel_basis", torch.rand(n_mels, n_fft // 2 + 1, dtype=torch.float32) * 0.01)
        self._window: torch.Tensor | None = None

    def forward(self, audio: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        if self._window is None or self._window.device != audio.device:
            self._window = torch.hann_window(self.n_fft, device=audio.device)
        spec = torch.stft(
            audio,
            self.n_fft,
            hop_length=self.hop,
            win_length=self.n_fft,
            window=self._window,
            center=True,
            return_complex=True,
        )
        magnitude = torch.sqrt(spec.real.pow(2) + spec.imag.pow(2))
        mel = torch.matmul(self.mel_basis, magnitude).to(out_dtype)
        return torch.log(torch.clamp(mel, min=1e-5))


# ---------------------------------------------------------------------------------------
# HuBERT-base content encoder via transformers (same shapes as fairseq's hubert_base).


class Fp32GroupNorm(nn.GroupNorm):
    """fairseq's group norm: computes in float32 and casts back (RVC's HuBERT does this)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.group_norm(
            x.float(),
            self.num_groups,
            self.weight.float() if self.weight is not None else None,
            self.bias.float() if self.bias is not None else None,
            self.eps,
        )
        return out.type_as(x)


def hubert_config(tiny: bool):
    """HubertConfig of hubert_base (transformers' defaults are exactly its shapes)."""
    from transformers import HubertConfig

    if tiny:
        return HubertConfig(
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=2,
            intermediate_size=64,
            conv_dim=(16,) * 7,
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=2,
            classifier_proj_size=8,
        )
    return HubertConfig()


class ContentEncoder(nn.Module):
    """HuBERT-base (transformers ``HubertModel``) + ``final_proj`` 768→256 for v1 models.

    All 12 layers stay resident (RVC loads the whole checkpoint), but v1 stops after
    layer 9 as fairseq's ``extract_features(output_layer=9)`` does.
    """

    def __init__(self, version: str, tiny: bool = False):
        super().__init__()
        from transformers import HubertModel

        config = hubert_config(tiny)
        self.version = version
        self.model = HubertModel(config)
        stem = self.model.feature_extractor.conv_layers[0]
        old = stem.layer_norm
        stem.layer_norm = Fp32GroupNorm(old.num_groups, old.num_channels, eps=old.eps, affine=True)
        total = config.num_hidden_layers
        self.run_layers = (total * 3) // 4 if version == "v1" else total  # 9 of 12
        self.final_proj = nn.Linear(config.hidden_size, config.classifier_proj_size) if version == "v1" else None
        self.model.eval()

    @property
    def out_dim(self) -> int:
        return self.final_proj.out_features if self.final_proj is not None else self.model.config.hidden_size

    @torch.no_grad()
    def encode(self, source: torch.Tensor) -> torch.Tensor:
        """Hidden states after layer 9 (v1) or 12 (v2): fairseq's ``extract_features``."""
        encoder = self.model.encoder
        layers = encoder.layers
        encoder.layers = layers[: self.run_layers]
        try:
            return self.model(source).last_hidden_state
        finally:
            encoder.layers = layers

    @torch.no_grad()
    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """v1's ``final_proj`` 768→256; v2 uses the hidden states as they are."""
        return self.final_proj(hidden) if self.final_proj is not None else hidden

    def forward(self, source: torch.Tensor) -> torch.Tensor:
        return self.project(self.encode(source))
