"""RVC's long-audio cutting, as plain functions over numpy arrays (no torch).

RVC bounds the GPU memory of one conversion by cutting files longer than ``x_max`` near
every ``x_center`` seconds, at the quietest 10 ms inside ±``x_query``; each piece is
converted with ``x_pad`` seconds of context on both sides, which are trimmed off the
output before the pieces are joined. The chunk lengths this produces are what the
allocator sees, so they follow RVC's ``Pipeline.pipeline`` arithmetic exactly: the
160-sample flooring, the reflect padding, the ``+160`` at a chunk's end and the per-chunk
trim.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

SAMPLE_RATE = 16_000  # RVC resamples every input to 16 kHz before anything else
WINDOW = 160  # 10 ms: the pitch hop and the cut granularity


@dataclass(frozen=True)
class ChunkPreset:
    """RVC's x_pad / x_query / x_center / x_max, in seconds (configs/config.py)."""

    name: str
    x_pad: float
    x_query: float
    x_center: float
    x_max: float

    @property
    def t_pad(self) -> int:
        return int(SAMPLE_RATE * self.x_pad)

    @property
    def t_query(self) -> int:
        return int(SAMPLE_RATE * self.x_query)

    @property
    def t_center(self) -> int:
        return int(SAMPLE_RATE * self.x_center)

    @property
    def t_max(self) -> int:
        return int(SAMPLE_RATE * self.x_max)

    def to_dict(self) -> dict[str, float | str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ChunkPreset:
        return cls(**data)


PRESETS: dict[str, ChunkPreset] = {
    "fp16": ChunkPreset("fp16", 3, 10, 60, 65),  # the "6 GB config", every fp16 GPU above 4 GB
    "fp32": ChunkPreset("fp32", 1, 6, 38, 41),  # the "5 GB config", fp32 (16xx/10xx/P40 cards)
    "low": ChunkPreset("low", 1, 5, 30, 32),  # gpu_mem <= 4 GB overrides both
}


def gpu_mem_gib(total_memory: int) -> int:
    """RVC's rounding of a card's memory to whole GiB: ``int(total/2**30 + 0.4)``."""
    return int(total_memory / 2**30 + 0.4)


def preset_for(is_half: bool, total_memory: int | None = None) -> ChunkPreset:
    """The preset RVC picks for a GPU: small cards get the low preset whatever the dtype."""
    if total_memory is not None and gpu_mem_gib(total_memory) <= 4:
        return PRESETS["low"]
    return PRESETS["fp16"] if is_half else PRESETS["fp32"]


@dataclass(frozen=True)
class Chunk:
    """One piece as converted: ``padded[start:end]`` and the pitch frames ``[f_start:f_end)``.

    Coordinates are in the file reflect-padded by ``t_pad`` on both sides; ``f_end`` is
    ``None`` for the last piece (it runs to the end of the pitch curve).
    """

    start: int
    end: int
    f_start: int
    f_end: int | None

    @property
    def samples(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict[str, int | None]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Chunk:
        return cls(**data)


@dataclass(frozen=True)
class ChunkPlan:
    """Where a file of ``length`` samples is cut and the pieces converted."""

    length: int
    preset: ChunkPreset
    cuts: tuple[int, ...]  # cut positions in the unpadded file, multiples of WINDOW
    chunks: tuple[Chunk, ...]

    @property
    def padded_length(self) -> int:
        return self.length + 2 * self.preset.t_pad

    @property
    def pitch_frames(self) -> int:
        """Frames of the whole-file pitch curve RVC uploads once (``p_len``)."""
        return self.padded_length // WINDOW

    def to_dict(self) -> dict:
        return {
            "length": self.length,
            "preset": self.preset.to_dict(),
            "cuts": list(self.cuts),
            "chunks": [c.to_dict() for c in self.chunks],
        }

    @classmethod
    def from_dict(cls, data: dict) -> ChunkPlan:
        return cls(
            length=int(data["length"]),
            preset=ChunkPreset.from_dict(data["preset"]),
            cuts=tuple(int(c) for c in data["cuts"]),
            chunks=tuple(Chunk.from_dict(c) for c in data["chunks"]),
        )


def window_energy(audio: np.ndarray) -> np.ndarray:
    """Sum of |x| over the 160 samples centred on each sample (reflect-padded by 80).

    RVC adds 160 shifted copies; a running sum gives the same values (to ~1e-15 relative)
    in one pass, which matters for ten-minute files. Exactly silent stretches still come out
    as exact zeros, so ties among them resolve to the first one as in RVC.
    """
    audio = np.asarray(audio, dtype=np.float64)
    magnitude = np.abs(np.pad(audio, (WINDOW // 2, WINDOW // 2), mode="reflect"))
    running = np.concatenate(([0.0], np.cumsum(magnitude)))
    return running[WINDOW : WINDOW + len(audio)] - running[: len(audio)]


def find_cuts(audio: np.ndarray, preset: ChunkPreset) -> list[int]:
    """Cut positions (unpadded samples, before flooring): the first quietest point near each mark."""
    n = len(audio)
    if n + WINDOW <= preset.t_max:
        return []
    energy = window_energy(audio)
    cuts = []
    for mark in range(preset.t_center, n, preset.t_center):
        lo = mark - preset.t_query
        segment = energy[lo : mark + preset.t_query]
        cuts.append(lo + int(np.flatnonzero(segment == segment.min())[0]))
    return cuts


def plan_from_cuts(length: int, cuts: list[int], preset: ChunkPreset) -> ChunkPlan:
    """Lay out the pieces for given raw cut positions (floored to 10 ms here, as RVC does)."""
    t_pad2 = 2 * preset.t_pad
    floored = tuple(c // WINDOW * WINDOW for c in cuts)
    chunks: list[Chunk] = []
    start = 0
    for cut in floored:
        chunks.append(Chunk(start, cut + t_pad2 + WINDOW, start // WINDOW, (cut + t_pad2) // WINDOW))
        start = cut
    chunks.append(Chunk(start, length + t_pad2, start // WINDOW, None))
    return ChunkPlan(length=length, preset=preset, cuts=floored, chunks=tuple(chunks))


def plan_chunks(audio: np.ndarray, preset: ChunkPreset) -> ChunkPlan:
    """RVC's cutting of one 16 kHz file: where it is cut and which pieces are converted."""
    return plan_from_cuts(len(audio), find_cuts(audio, preset), preset)


def pad_audio(audio: np.ndarray, preset: ChunkPreset) -> np.ndarray:
    """The file reflect-padded by ``t_pad`` on both sides (what the chunks index into)."""
    return np.pad(np.asarray(audio), (preset.t_pad, preset.t_pad), mode="reflect")


def hubert_frames(samples: int) -> int:
    """Frames of the HuBERT conv stem (receptive field 400, stride 320) for a chunk."""
    return (samples - 400) // 320 + 1


def synth_frames(samples: int) -> int:
    """Synthesizer frames of a chunk: HuBERT features interpolated ×2 (50 → 100 fps)."""
    return 2 * hubert_frames(samples)


def trim(output: np.ndarray, tgt_sr: int, preset: ChunkPreset) -> np.ndarray:
    """Drop the ``x_pad`` seconds of context from both ends of one converted piece."""
    t_pad_tgt = int(tgt_sr * preset.x_pad)
    return output[t_pad_tgt:-t_pad_tgt] if t_pad_tgt else output


def reassemble(outputs: list[np.ndarray], tgt_sr: int, preset: ChunkPreset) -> np.ndarray:
    """Join converted pieces into the output file (each trimmed of its padding first)."""
    if not outputs:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([trim(o, tgt_sr, preset) for o in outputs])


def output_length(plan: ChunkPlan, hop: int, tgt_sr: int) -> int:
    """Samples of the reassembled output: per piece ``synth_frames·hop`` minus both trims."""
    t_pad_tgt = int(tgt_sr * plan.preset.x_pad)
    return sum(max(synth_frames(c.samples) * hop - 2 * t_pad_tgt, 0) for c in plan.chunks)


def speech_like(rng: np.random.Generator, seconds: float, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Noise shaped into phrases and pauses, peak 0.95: gives the cutter real quiet spots.

    The cut positions depend on where the silences are; white noise would put every cut at
    an arbitrary point, a real recording puts them in pauses between phrases.
    """
    n = int(seconds * sr)
    envelope = np.empty(n)
    pos = 0
    speaking = True
    while pos < n:
        span = int(sr * (rng.uniform(0.4, 4.0) if speaking else rng.uniform(0.05, 0.8)))
        end = min(n, pos + span)
        if speaking:
            ramp = np.sin(np.linspace(0.0, np.pi, end - pos)) * rng.uniform(0.3, 1.0)
            envelope[pos:end] = ramp
        else:
            envelope[pos:end] = 1e-3
        pos = end
        speaking = not speaking
    audio = rng.standard_normal(n) * envelope
    peak = np.abs(audio).max() if n else 0.0
    return audio * (0.95 / peak) if peak > 0 else audio
