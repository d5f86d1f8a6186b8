"""RVC's cutting rule (alloctune.workloads.chunking) against hand-computed cases.

Expected numbers are worked out by hand from rvc-workload.md §1.2–1.4 (fp16 preset:
t_pad 48,000, t_query 160,000, t_center 960,000, t_max 1,040,000 samples at 16 kHz).
"""

from __future__ import annotations

import numpy as np
import pytest

from alloctune.workloads import chunking
from alloctune.workloads.chunking import PRESETS, Chunk

FP16 = PRESETS["fp16"]


def test_presets_in_samples():
    assert (FP16.t_pad, FP16.t_query, FP16.t_center, FP16.t_max) == (48_000, 160_000, 960_000, 1_040_000)
    fp32, low = PRESETS["fp32"], PRESETS["low"]
    assert (fp32.t_pad, fp32.t_query, fp32.t_center, fp32.t_max) == (16_000, 96_000, 608_000, 656_000)
    assert (low.t_pad, low.t_query, low.t_center, low.t_max) == (16_000, 80_000, 480_000, 512_000)


@pytest.mark.parametrize(
    ("is_half", "total", "expected"),
    [
        (True, 150_109_880_320, "fp16"),  # H200: nothing scales chunks up on big cards
        (False, 150_109_880_320, "fp32"),
        (True, None, "fp16"),
        (True, 4 * 2**30, "low"),
        (True, int(4.55 * 2**30), "low"),  # int(4.55 + 0.4) = 4
        (True, int(4.65 * 2**30), "fp16"),  # int(4.65 + 0.4) = 5
        (False, 2 * 2**30, "low"),
    ],
)
def test_preset_choice_follows_rvc(is_half, total, expected):
    assert chunking.preset_for(is_half, total).name == expected


def test_short_file_is_one_padded_chunk():
    audio = np.ones(1_000_000)  # 62.5 s
    plan = chunking.plan_chunks(audio, FP16)
    assert plan.cuts == ()
    assert plan.chunks == (Chunk(0, 1_096_000, 0, None),)
    assert plan.pitch_frames == 6850
    # HuBERT: (1,096,000 - 400) // 320 + 1 = 3424 frames → 6848 synth frames.
    assert chunking.hubert_frames(1_096_000) == 3424
    assert chunking.synth_frames(1_096_000) == 6848
    # 40 kHz (hop 400): 6848·400 − 2·120,000 trimmed.
    assert chunking.output_length(plan, hop=400, tgt_sr=40_000) == 2_499_200


def test_split_threshold_is_x_max_minus_one_window():
    assert chunking.find_cuts(np.ones(1_039_840), FP16) == []  # len + 160 == t_max: no split
    assert chunking.find_cuts(np.ones(1_039_841), FP16) == [800_000]  # flat energy: first point of the window


def _with_silence(length: int, *spans: tuple[int, int]) -> np.ndarray:
    audio = np.ones(length)
    for lo, hi in spans:
        audio[lo:hi] = 0.0
    return audio


def test_cut_lands_in_silence_and_is_floored():
    # Silence over [1,000,000, 1,001,000): the centred 160-sample energy is 0 for
    # i in [1,000,080, 1,000,920]; the first zero is the cut, floored to 1,000,000.
    # The second mark (1,920,000) sees flat energy: cut at 1,920,000 − 160,000.
    audio = _with_silence(2_000_000, (1_000_000, 1_001_000))
    assert chunking.find_cuts(audio, FP16) == [1_000_080, 1_760_000]
    plan = chunking.plan_chunks(audio, FP16)
    assert plan.cuts == (1_000_000, 1_760_000)
    assert plan.chunks == (
        Chunk(0, 1_096_160, 0, 6850),
        Chunk(1_000_000, 1_856_160, 6250, 11_600),
        Chunk(1_760_000, 2_096_000, 11_000, None),
    )
    assert [c.samples for c in plan.chunks] == [1_096_160, 856_160, 336_000]
    assert [chunking.synth_frames(c.samples) for c in plan.chunks] == [6850, 5350, 2098]
    # Kept per chunk: (t − s)/160 frames, the last one 2 frames short → 124.98 s at 40 kHz.
    assert chunking.output_length(plan, hop=400, tgt_sr=40_000) == 2_500_000 + 1_900_000 + 599_200


def test_first_quietest_point_wins_ties():
    audio = _with_silence(1_200_000, (850_000, 851_000), (1_050_000, 1_051_000))
    assert chunking.find_cuts(audio, FP16) == [850_080]
    assert chunking.plan_chunks(audio, FP16).cuts == (850_080,)  # already a multiple of 160


def test_window_energy_is_a_centred_sum_of_magnitudes():
    rng = np.random.default_rng(3)
    audio = rng.standard_normal(2000)
    padded = np.pad(np.abs(audio), (80, 80), mode="reflect")
    direct = np.array([padded[i : i + 160].sum() for i in range(len(audio))])
    np.testing.assert_allclose(chunking.window_energy(audio), direct, rtol=1e-12)


def test_pad_and_reassemble():
    audio = np.arange(1_100_000, dtype=np.float64)
    padded = chunking.pad_audio(audio, FP16)
    assert len(padded) == 1_196_000
    assert padded[48_000] == 0 and padded[47_999] == 1 and padded[-48_001] == 1_099_999  # reflect
    plan = chunking.plan_from_cuts(len(audio), [960_100], FP16)
    assert plan.cuts == (960_000,)
    hop, sr = 400, 40_000
    outputs = [np.arange(chunking.synth_frames(c.samples) * hop, dtype=np.float32) for c in plan.chunks]
    joined = chunking.reassemble(outputs, sr, FP16)
    assert len(joined) == chunking.output_length(plan, hop, sr)
    # First chunk: 1,056,160 samples → 6600 frames → 2,640,000 out, 2,400,000 kept from 120,000.
    assert len(outputs[0]) == 2_640_000
    assert joined[0] == 120_000 and joined[2_399_999] == 2_519_999 and joined[2_400_000] == 120_000
    assert chunking.reassemble([], sr, FP16).shape == (0,)


def test_long_file_chunk_count_matches_rvc_table():
    # rvc-workload.md §1.3: fp16 → 2 chunks for 65–120 s, then ceil(len / 60 s).
    rng = np.random.default_rng(0)
    for seconds, chunks in ((64.9, 1), (66, 2), (119, 2), (180, 3), (300, 5)):
        audio = chunking.speech_like(rng, seconds)
        plan = chunking.plan_chunks(audio, FP16)
        assert len(plan.chunks) == chunks, seconds
        largest = max(c.samples for c in plan.chunks)
        assert largest <= 1_376_160  # the 86.01 s worst case


def test_plan_round_trips_through_dict():
    plan = chunking.plan_chunks(_with_silence(2_000_000, (1_000_000, 1_001_000)), FP16)
    assert chunking.ChunkPlan.from_dict(plan.to_dict()) == plan


def test_speech_like_is_seeded_and_normalised():
    a = chunking.speech_like(np.random.default_rng(7), 2.5)
    b = chunking.speech_like(np.random.default_rng(7), 2.5)
    assert len(a) == 40_000
    np.testing.assert_array_equal(a, b)
    assert np.abs(a).max() == pytest.approx(0.95)
