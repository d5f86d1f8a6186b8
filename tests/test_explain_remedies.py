"""#29.1: release points, simulated. `empty_cache()` where every repetition ends, applied to a recording
made without it, must give what the same program that really called it reached: the shared H200 RVC
recordings exist both ways (rvc_ec0: never empties the cache; rvc_ec1: `empty_cache()` after every chunk,
as RVC's pipeline does), and each run's real peak reserved is in its sidecar (torch's own
`memory_stats()`)."""

from __future__ import annotations

import json

import pytest

from alloctune.explain.core import analyse
from alloctune.explain.remedies import release_points, repetition_ends, with_empty_cache
from alloctune.trace import load_trace
from alloctune.trace.model import EMPTY_CACHE


@pytest.mark.parametrize("setting", ["default", "expandable", "roundup4"])
def test_empty_cache_after_every_chunk_gives_the_real_peak_of_the_program_that_does_it(traces_dir, setting):
    an = analyse(load_trace(traces_dir / "rvc_ec0" / f"{setting}.pickle.xz"))
    assert an.repeats.count == 16  # the 16 chunks the program converted
    every = release_points(an, None, every=(1,))[0]
    real = json.loads((traces_dir / "rvc_ec1" / f"{setting}.json").read_text())["stats"]["reserved_bytes.all.peak"]
    assert every.peak_reserved == real
    assert every.extra_driver_calls > 0 and every.extra_seconds > 0 and "Janitor(every_n=1)" in every.code


def test_release_points_sit_where_the_live_bytes_are_lowest(traces_dir):
    an = analyse(load_trace(traces_dir / "rvc_ec0" / "default.pickle.xz"))
    ends = repetition_ends(an)
    lb, starts = an.live_before, an.repeats.starts
    assert len(ends) == len(starts) - 1
    for j, e in enumerate(ends):
        assert starts[j] < e <= starts[j + 1] and lb[e] == min(lb[starts[j] + 1 : starts[j + 1] + 1])
    t = with_empty_cache(an.trace, ends[:3])
    assert t.requests.count(EMPTY_CACHE) == an.trace.requests.count(EMPTY_CACHE) + 3
    assert len(t.requests) == len(an.trace.requests) + 3


def test_explain_json_carries_the_remedies(traces_dir):
    from alloctune import api

    d = api.explain(traces_dir / "rvc_ec0" / "default.pickle.xz").to_dict()
    names = [r["name"] for r in d["remedies"]]
    assert names[0] == "empty_cache() at the end of every repetition"
    r = d["remedies"][0]
    assert r["method"] == "simulated" and r["saving"] == d["min_budget"] - r["min_budget"] > 0
