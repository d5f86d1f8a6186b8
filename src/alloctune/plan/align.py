"""Align the request streams of one program recorded at several input sizes.

The same program asked for the same sequence of requests at every size, only the byte
counts differ — that is the premise of a size-parametric trace. Where it does not hold (a
cuDNN algorithm chosen by shape, a branch taken at some sizes only) we align what can be
aligned and report the rest with its positions, instead of refusing the whole recording.

A request is compared by its *structure token*, never by its size (sizes are what differ):
(op, stream), and empty_cache -> (EMPTY_CACHE,). A free is the same free in both streams
only if the allocs it releases are paired too (checked after the diff). Identical token
sequences (the common case) align one to one in linear time; otherwise both streams are
walked together and each difference is closed at the nearest point where they agree again,
with Myers' minimal diff inside it (linear overall for streams that differ in many small
places, which is what a size-dependent branch makes). A difference that never closes goes to
Myers whole; past `MAX_EDITS` it is left unaligned and reported, rather than spending minutes
on streams that are not the same program.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Sequence

from alloctune.trace.model import ALLOC, EMPTY_CACHE, FREE, RequestStream

Token = tuple[int, ...]
MAX_EDITS = 2000  # Myers diff gives up beyond this many inserted + deleted requests


def structure(req: RequestStream) -> tuple[list[Token], list[int]]:
    """Tokens of a stream and, per request, the index of the alloc request a free releases (-1 else,
    and for a free of a block allocated before the history began)."""
    tokens: list[Token] = []
    owner: list[int] = []
    alloc_at: dict[int, int] = {}  # rid -> request index of its alloc
    for i, (op, _size, rid, stream) in enumerate(req):
        if op == ALLOC:
            alloc_at[rid] = i
            tokens.append((op, stream))
            owner.append(-1)
        elif op == FREE:
            tokens.append((op, stream))
            owner.append(alloc_at.pop(rid, -1))
        elif op == EMPTY_CACHE:
            tokens.append((op,))
            owner.append(-1)
        else:
            tokens.append((op, stream))
            owner.append(-1)
    return tokens, owner


@dataclass(frozen=True)
class Gap:
    """A run of requests in one stream with no counterpart in the other (positions are request indices)."""

    start: int
    stop: int  # exclusive
    other_start: int
    other_stop: int

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Pairing:
    """Which request of stream B each request of stream A corresponds to (-1: none)."""

    counterpart: tuple[int, ...]
    identical: bool
    gaps: tuple[Gap, ...]  # unaligned runs (A positions, B positions)

    @property
    def aligned(self) -> int:
        return sum(1 for j in self.counterpart if j >= 0)

    def to_dict(self) -> dict[str, Any]:
        return {"identical": self.identical, "aligned": self.aligned, "gaps": [g.to_dict() for g in self.gaps]}


def pair(
    a: tuple[list[Token], list[int]],
    b: tuple[list[Token], list[int]],
    sizes: tuple[Sequence[int], Sequence[int]] | None = None,
    xs: tuple[Fraction, Fraction] | None = None,
    max_edits: int = MAX_EDITS,
) -> Pairing:
    """Pair the requests of two structures; frees are kept only when their allocs are paired too.

    A minimal diff is not unique (an inserted alloc can be taken for its neighbour), so with
    `sizes` and input sizes `xs` the requests around every difference are re-paired by a small
    weighted alignment that prefers partners whose bytes could follow one law (equal, or grown
    at most quadratically with the input).
    """
    ta, oa = a
    tb, ob = b
    if ta == tb:
        return Pairing(tuple(range(len(ta))), True, ())
    cp = [-1] * len(ta)
    for i, j in _matches(ta, tb, max_edits):
        cp[i] = j
    if sizes is not None and xs is not None:
        _refine(cp, a, b, sizes, xs)
    # A free matched by token is only the same free if it releases the paired alloc.
    for i, j in enumerate(cp):
        if j >= 0 and ta[i][0] == FREE:
            if (oa[i] < 0) != (ob[j] < 0) or (oa[i] >= 0 and cp[oa[i]] != ob[j]):
                cp[i] = -1
    return Pairing(tuple(cp), False, tuple(gaps_of(cp, len(tb))))


REFINE_CONTEXT = 12  # requests of context re-paired on each side of a difference
REFINE_SPAN = 256  # nearby differences share one region up to this many requests
REFINE_MAX = 2000  # larger difference regions keep the plain diff (the DP is quadratic)


def _refine(
    cp: list[int],
    a: tuple[list[Token], list[int]],
    b: tuple[list[Token], list[int]],
    sizes: tuple[Sequence[int], Sequence[int]],
    xs: tuple[Fraction, Fraction],
) -> None:
    """Re-pair each difference region (plus context) by a weighted alignment, in place."""
    (ta, oa), (tb, ob) = a, b
    sa, sb = sizes
    lo, hi = (xs[0], xs[1]) if xs[0] <= xs[1] else (xs[1], xs[0])
    grow = float((hi / lo) ** 2) if lo > 0 else 1.0

    def bytes_of(t: list[Token], o: list[int], s: Sequence[int], i: int) -> int:
        return s[o[i]] if t[i][0] == FREE and o[i] >= 0 else s[i]

    def plausible(i: int, j: int) -> bool:
        u, v = bytes_of(ta, oa, sa, i), bytes_of(tb, ob, sb, j)
        if u == v:
            return True
        small, big = (u, v) if xs[0] <= xs[1] else (v, u)
        return 0 <= small < big <= small * grow + 4096

    regions: list[list[int]] = []  # [start, end) of each region, merged while they overlap
    for g in gaps_of(cp, len(tb)):
        s0 = max(0, g.start - REFINE_CONTEXT)
        e0 = min(len(ta), g.stop + REFINE_CONTEXT)
        if regions and s0 <= regions[-1][1] and e0 - regions[-1][0] <= REFINE_SPAN:
            regions[-1][1] = e0
        else:
            regions.append([s0, e0])

    def settled(s0: int, e0: int) -> bool:
        """Every pair in the region could follow one law and every paired free releases the paired alloc."""
        for i in range(s0, e0):
            j = cp[i]
            if j < 0:
                continue
            if not plausible(i, j):
                return False
            if ta[i][0] == FREE and oa[i] >= 0 and (ob[j] < 0 or cp[oa[i]] != ob[j]):
                return False
        return True

    for s0, e0 in regions:
        if settled(s0, e0):
            continue
        # the B range: from the partner of the last paired request before s0 to the first after e0
        bs = next((cp[i] + 1 for i in range(s0 - 1, -1, -1) if cp[i] >= 0), 0)
        be = next((cp[i] for i in range(e0, len(ta)) if cp[i] >= 0), len(tb))
        if (e0 - s0) * (be - bs) > REFINE_MAX * REFINE_MAX:
            continue
        for i in range(s0, e0):
            cp[i] = -1
        for i, j in _weighted_lcs(ta, tb, s0, e0, bs, be, plausible):
            cp[i] = j


def _weighted_lcs(
    ta: Sequence[Any], tb: Sequence[Any], s0: int, e0: int, bs: int, be: int, plausible: Callable[[int, int], bool]
) -> list[tuple[int, int]]:
    """Pairs maximising sum of (2 + plausible) over equal tokens: the most matches, then the likeliest."""
    n, m = e0 - s0, be - bs
    score = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, nxt = score[i], score[i + 1]
        for j in range(m - 1, -1, -1):
            best = nxt[j] if nxt[j] > row[j + 1] else row[j + 1]
            if ta[s0 + i] == tb[bs + j]:
                w = nxt[j + 1] + 2 + (1 if plausible(s0 + i, bs + j) else 0)
                if w > best:
                    best = w
            row[j] = best
    out = []
    i = j = 0
    while i < n and j < m:
        if ta[s0 + i] == tb[bs + j] and score[i][j] == score[i + 1][j + 1] + 2 + (1 if plausible(s0 + i, bs + j) else 0):
            out.append((s0 + i, bs + j))
            i += 1
            j += 1
        elif score[i + 1][j] >= score[i][j + 1]:
            i += 1
        else:
            j += 1
    return out


RESYNC_GRAMS = (16, 6)  # requests that must agree again after a difference (longest first)
RESYNC_WINDOW = 512  # how far ahead (in each stream) a difference may end


def _matches(ta: list[Token], tb: list[Token], max_edits: int) -> list[tuple[int, int]]:
    """Index pairs of equal tokens, walking both streams together.

    Where they differ, the nearest point where 16 requests agree again (the smallest total skip
    within RESYNC_WINDOW; 6 when the streams never agree that long) ends the difference, and Myers' minimal diff pairs what it
    can inside it: linear in the stream length for streams that differ in many small places
    (a branch in every layer). A difference that does not end within the window goes to Myers
    whole (bounded by `max_edits`).
    """
    codes: dict[Token, int] = {}
    a = [codes.setdefault(t, len(codes)) for t in ta]
    b = [codes.setdefault(t, len(codes)) for t in tb]
    n, m = len(a), len(b)
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < n and j < m:
        if a[i] == b[j]:
            out.append((i, j))
            i += 1
            j += 1
            continue
        skip = next((r for g in RESYNC_GRAMS if (r := _resync(a, b, i, j, g)) is not None), None)
        if skip is None:
            out += [(i + x, j + y) for x, y in _myers(a[i:], b[j:], max_edits)]
            break
        di, dj = skip
        out += [(i + x, j + y) for x, y in _myers(a[i : i + di], b[j : j + dj], max_edits)]
        i += di
        j += dj
    return out


def _resync(a: list[int], b: list[int], i: int, j: int, g: int) -> tuple[int, int] | None:
    """Smallest di + dj with a[i+di:][:g] == b[j+dj:][:g], g requests each (None near the ends:
    Myers takes the rest; a short common tail would match almost anywhere)."""
    first: dict[tuple[int, ...], int] = {}
    for dj in range(min(RESYNC_WINDOW, len(b) - j - g) + 1):
        first.setdefault(tuple(b[j + dj : j + dj + g]), dj)
    best: tuple[int, int] | None = None
    for di in range(min(RESYNC_WINDOW, len(a) - i - g) + 1):
        if best is not None and di >= best[0] + best[1]:
            break
        key = tuple(a[i + di : i + di + g])
        hit = first.get(key)
        if hit is not None and (di or hit) and (best is None or di + hit < best[0] + best[1]):
            best = (di, hit)
    return best


def _myers(a: list[int], b: list[int], max_d: int) -> list[tuple[int, int]]:
    """Matched index pairs of a shortest edit script from a to b (Myers 1986), [] past max_d edits."""
    n, m = len(a), len(b)
    if not n or not m:
        return []
    limit = min(max_d, n + m)
    off = limit + 1
    v = [0] * (2 * limit + 3)
    trace: list[list[int]] = []
    end_d = -1
    for d in range(limit + 1):
        trace.append(v[off - d - 1 : off + d + 2])  # v before step d, for k in [-d-1, d+1]
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[off + k - 1] < v[off + k + 1]):
                x = v[off + k + 1]
            else:
                x = v[off + k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x += 1
                y += 1
            v[off + k] = x
            if x >= n and y >= m:
                end_d = d
                break
        if end_d >= 0:
            break
    if end_d < 0:
        return []
    pairs: list[tuple[int, int]] = []
    x, y = n, m
    for d in range(end_d, 0, -1):
        vd = trace[d]  # index k + d + 1
        k = x - y
        down = k == -d or (k != d and vd[k - 1 + d + 1] < vd[k + 1 + d + 1])
        prev_k = k + 1 if down else k - 1
        prev_x = vd[prev_k + d + 1]
        mid_x = prev_x if down else prev_x + 1
        while x > mid_x:
            x -= 1
            y -= 1
            pairs.append((x, y))
        x, y = prev_x, prev_x - prev_k
    while x > 0 and y > 0:
        x -= 1
        y -= 1
        pairs.append((x, y))
    pairs.reverse()
    return pairs


def gaps_of(cp: list[int], n_other: int) -> list[Gap]:
    """Unaligned runs: between two consecutive paired requests, what either side has in excess."""
    out: list[Gap] = []
    prev_i, prev_j = -1, -1
    for i, j in [(i, j) for i, j in enumerate(cp) if j >= 0] + [(len(cp), n_other)]:
        if i - prev_i > 1 or j - prev_j > 1:
            out.append(Gap(prev_i + 1, i, prev_j + 1, j))
        prev_i, prev_j = i, j
    return out
