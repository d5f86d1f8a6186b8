"""Aligning request streams that differ in places (a branch taken at some sizes only)."""

import random
import time

from alloctune.plan.align import _matches, _myers, pair, structure
from alloctune.trace.model import ALLOC, FREE, RequestStream


def _lcs(a, b):
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for k, y in enumerate(b):
            cur = row[k + 1]
            row[k + 1] = prev + 1 if x == y else max(row[k + 1], row[k])
            prev = cur
    return row[-1]


def test_myers_is_a_longest_common_subsequence():
    rng = random.Random(1)
    for _ in range(200):
        a = [rng.randint(0, 3) for _ in range(rng.randint(0, 30))]
        b = list(a)
        for _ in range(rng.randint(0, 5)):
            if b and rng.random() < 0.5:
                del b[rng.randrange(len(b))]
            else:
                b.insert(rng.randint(0, len(b)), rng.randint(0, 3))
        pairs = _myers(a, b, 100)
        assert all(a[i] == b[j] for i, j in pairs)
        assert all(p[0] < q[0] and p[1] < q[1] for p, q in zip(pairs, pairs[1:]))
        assert len(pairs) == (_lcs(a, b) if a and b else 0)


def test_walk_and_resync_pairs_nearly_everything():
    rng = random.Random(2)
    for _ in range(50):
        a = [(rng.randint(0, 5),) for _ in range(rng.randint(50, 400))]
        b = list(a)
        edits = rng.randint(1, 8)
        for _ in range(edits):
            b.insert(rng.randint(0, len(b)), (9,))
        pairs = _matches(a, b, 2000)
        assert all(a[i] == b[j] for i, j in pairs)
        assert all(p[0] < q[0] and p[1] < q[1] for p, q in zip(pairs, pairs[1:]))
        assert len(pairs) == len(a)  # only insertions: every request of a has its partner


def _layers(n_layers, branch):
    """Per layer: an activation, four temporaries, a workspace only when `branch`, the frees."""
    req = RequestStream()
    rid = 0
    for _ in range(n_layers):
        act = rid
        req.append(ALLOC, 4096, act, 0, 0)
        tmp = list(range(rid + 1, rid + 5))
        for t in tmp:
            req.append(ALLOC, 8192, t, 0, 0)
        if branch:
            req.append(ALLOC, 1 << 25, rid + 5, 0, 0)
            req.append(FREE, -1, rid + 5, 0, 0)
        for t in tmp:
            req.append(FREE, -1, t, 0, 0)
        req.append(FREE, -1, act, 0, 0)
        rid += 6
    return req


def test_a_branch_in_every_layer_of_a_long_stream_is_linear_time():
    a, b = _layers(5_000, False), _layers(5_000, True)  # 50k vs 60k requests, 5k differences
    t0 = time.perf_counter()
    p = pair(structure(a), structure(b), (a.sizes, b.sizes), (1, 2))
    elapsed = time.perf_counter() - t0
    assert p.aligned == len(a) and len(p.gaps) == 5_000
    assert all(g.stop == g.start and g.other_stop - g.other_start == 2 for g in p.gaps)
    assert p.gaps[0].start == 5  # after the activation and the four temporaries of the first layer
    assert elapsed < 60  # seconds, on a shared 2-core machine; a plain minimal diff takes far longer here


def test_streams_that_never_agree_again_are_left_unaligned_and_reported():
    a = [(0,), (1,)] * 3000
    b = [(0,), (0,), (1,), (1,)] * 3000
    pairs = _matches(a, b, 50)  # the minimal diff gives up past 50 edits
    assert len(pairs) < len(a)
    assert all(a[i] == b[j] for i, j in pairs)
