"""The size-parametric trace on real H200 recordings at several sizes (batch 8 on the H200, kept as fixtures).

`tests/data/size_recordings/size_{workload}_{S}.pickle.xz`: one item of size S per fresh process, default setting; the
held-back check fits on the other sizes and must reproduce the GPU's peak reserved.
"""

from pathlib import Path

import pytest

from alloctune.plan.holdout import holdout
from alloctune.trace.load import load_trace

DATA = Path(__file__).resolve().parent / "data" / "size_recordings"


def _recs(workload, sizes):
    paths = [DATA / f"size_{workload}_{s}.pickle.xz" for s in sizes]
    if not all(p.is_file() for p in paths):
        pytest.skip(f"no {workload} size recordings in {DATA}")
    return [(s, load_trace(p)) for s, p in zip(sizes, paths)]


def test_llama_prompt_length_held_back_exactly():
    recs = _recs("llama", [512, 1024, 2048, 3072, 4096, 6144])
    h = holdout(recs, 3072)
    assert h.same_structure and h.peak_real and abs(h.error_vs_real) <= 0.01


def test_rvc_audio_seconds_held_back_within_one_percent():
    recs = _recs("rvc", [10, 20, 30, 40, 50, 60])
    h = holdout(recs, 50)
    assert h.same_structure and abs(h.error_vs_real) <= 0.01
