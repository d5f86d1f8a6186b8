"""Size-parametric traces from synthetic recordings with known size laws."""

import gzip
import json

import pytest
from plan_programs import program

from alloctune.errors import InputError, TraceError
from alloctune.plan import fileformat
from alloctune.plan.holdout import holdout
from alloctune.plan.traceset import build
from alloctune.sim.replay import replay
from alloctune.trace.model import ALLOC

SIZES = (256, 512, 1024, 2048)


def _same_stream(a, b):
    ra, rb = a.requests, b.requests
    assert ra.ops == rb.ops and ra.streams == rb.streams
    assert [s for s, op in zip(ra.sizes, ra.ops) if op == ALLOC] == [s for s, op in zip(rb.sizes, rb.ops) if op == ALLOC]


@pytest.mark.parametrize("law", ["linear", "quadratic", "mixed"])
def test_generated_stream_equals_the_program_at_unseen_sizes(law):
    ts = build([(x, program(x, law=law)) for x in SIZES])
    assert ts.identical
    kinds = ts.summary()["laws"]
    assert "table (inexact)" not in kinds
    if law == "linear":
        assert "degree 2" not in kinds
    else:
        assert kinds.get("degree 2", 0) > 0
    for x in (100, 700, 1500, 3000):  # inside and outside the recorded range
        g = ts.generate(x)
        _same_stream(g.trace, program(x, law=law))
        assert g.extrapolated == (not 256 <= x <= 2048)
        # and the simulator sees the same program
        assert replay(g.trace, addresses="model").peak_reserved == replay(program(x, law=law),
                                                                           addresses="model").peak_reserved


def test_shape_dependent_branch_is_aligned_and_reported_with_positions():
    recs = [(x, program(x, branch_at=600)) for x in SIZES]
    ts = build(recs)
    assert not ts.identical and len(ts.variants) == 2
    small, large = sorted(ts.variants, key=lambda v: v.sizes)
    # the workspace (alloc + free) appears once per layer and item: 6 layers x 2 items
    gaps = small.gaps["1024"]
    assert len(gaps) == 12 and all(g.stop - g.start == 0 and g.other_stop - g.other_start == 2 for g in gaps)
    assert gaps[0].start == 10  # after the 6 weights, the input and the first layer's 3 temporaries
    # every request is still fitted exactly, over all four sizes where it exists
    assert "table (inexact)" not in ts.summary()["laws"]
    assert max(large.points) == 4 and min(p for p, k in zip(large.points, large.law) if k >= 0) == 2
    for x in (300, 768, 1500, 4000):
        g = ts.generate(x)
        expect_branch = x >= 768  # the nearer recorded structure (768 is a tie: the larger wins)
        _same_stream(g.trace, program(x, branch_at=600 if expect_branch else 10**9))


def test_holdout_reproduces_the_peak_of_a_recording_it_never_saw():
    recs = [(x, program(x)) for x in (256, 512, 1024, 1536, 2048)]
    h = holdout(recs, 1536)
    assert h.fitted_on == ("256", "512", "1024", "2048")
    assert h.same_structure and h.sizes_exact == 1.0
    assert h.peak_generated == h.peak_replayed
    assert not h.extrapolated


def test_holdout_exposes_a_law_the_fit_cannot_know():
    # a program whose size law changes beyond the fitted range: the check must fail loudly
    recs = [(x, program(x)) for x in (256, 512, 1024)]
    odd = program(2048, law="linear")  # structure differs: attention missing at 2048
    h = holdout(recs + [(2048, odd)], 2048)
    assert not h.same_structure or h.sizes_exact < 1.0
    assert abs(h.error_vs_replay) > 0.01


def test_file_round_trip_and_damage(tmp_path):
    ts = build([(x, program(x, branch_at=600)) for x in SIZES])
    path = tmp_path / "p.atraceset"
    n = fileformat.save(ts, path)
    assert n == path.stat().st_size and n < 4000
    assert fileformat.is_traceset(path)
    back = fileformat.load(path)
    assert back == ts
    for x in (300, 900):
        _same_stream(back.generate(x).trace, ts.generate(x).trace)
    d = json.loads(gzip.decompress(path.read_bytes()))
    d["version"] = 99
    path.write_bytes(gzip.compress(json.dumps(d).encode()))
    with pytest.raises(TraceError, match="version 99"):
        fileformat.load(path)
    d["version"] = 1
    d["variants"][0]["law"][0] = 10**6
    path.write_bytes(gzip.compress(json.dumps(d).encode()))
    with pytest.raises(TraceError, match="damaged"):
        fileformat.load(path)
    path.write_bytes(b"\x1f\x8bnot gzip")
    with pytest.raises(TraceError):
        fileformat.load(path)


def test_bad_builds_are_input_errors():
    with pytest.raises(InputError):
        build([(256, program(256))])
    with pytest.raises(InputError):
        build([(256, program(256)), (256.0, program(256))])
    with pytest.raises(InputError):
        build([(0, program(256)), (1, program(512))])


def test_plan_core_does_not_import_torch_or_matplotlib():
    import subprocess
    import sys

    code = ("import sys, alloctune.plan, alloctune.plan.service, alloctune.plan.figure, alloctune.run.record, "
            "alloctune.cli.plan_cmd; print('torch' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
