"""Fallible requests: a failed request with fallback sizes continues the way the program does."""

from alloctune.sim.replay import replay
from alloctune.trace.model import ALLOC, FREE, RequestStream, Trace

GiB = 1 << 30


def _trace(fallbacks=None) -> Trace:
    rs = RequestStream()
    rs.append(ALLOC, 2 * GiB, 1, 0, 0)
    rs.append(ALLOC, 3 * GiB, 2, 0, 1)  # a workspace: too big under a 4 GiB cap
    rs.append(FREE, -1, 2, 0, 2)
    rs.append(FREE, -1, 1, 0, 3)
    if fallbacks:
        rs.fallbacks.update(fallbacks)
    return Trace("synthetic", 0, rs, [], {})


def test_without_fallbacks_the_failure_is_the_oom_point():
    r = replay(_trace(), budget=4 * GiB, addresses="model")
    assert not r.completed and r.oom is not None and r.oom.request_index == 1
    assert r.adapted == ()


def test_fallback_sizes_are_tried_in_order_and_counted_as_ooms():
    r = replay(_trace({1: (int(2.5 * GiB), 1 * GiB)}), budget=4 * GiB, addresses="model")
    assert r.completed and r.adapted == (1,)
    assert r.stats["num_ooms"] == 2  # the original request and the first fallback both failed
    assert r.peak_allocated == 3 * GiB  # 2 GiB + the 1 GiB fallback


def test_fallbacks_change_nothing_when_the_request_fits():
    plain = replay(_trace(), addresses="model")
    tagged = replay(_trace({1: (1 * GiB,)}), addresses="model")
    assert tagged.to_dict() == plain.to_dict()
