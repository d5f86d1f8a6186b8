"""A size-parametric trace: one program's request stream as a function of its input size.

Built from recordings of the same program at several input sizes (`build`): the streams
are aligned (`plan.align`), each request's size is fitted exactly in the input size
(`plan.fit`), and `generate(x)` writes out the stream the program would make at size x —
a `trace.model.Trace` the exact simulator replays like a recording.

Where the recordings' structures differ (a branch taken at some sizes only), each distinct
structure is kept as a *variant* with the sizes it was seen at; a request of a variant is
fitted over every recording that has a counterpart for it. A size is generated from the
variant seen at the nearest recorded size (ties: the larger, as its branch is usually the
hungrier one), and the answer says so: between two recorded sizes of different structure
nobody knows where the program switches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Sequence

from alloctune.errors import InputError
from alloctune.plan.align import Gap, gaps_of, pair, structure
from alloctune.plan.fit import Law, fit
from alloctune.trace.model import ALLOC, FAILED_ALLOC, FREE, RequestStream, Trace


def as_size(x: Any) -> Fraction:
    """An input size as an exact number: 7, 7.5, '7.5', '15/2' (floats via their decimal text)."""
    try:
        value = Fraction(str(x)) if not isinstance(x, Fraction) else x
    except (ValueError, ZeroDivisionError):
        raise InputError(f"input size {x!r} is not a number") from None
    if value <= 0:
        raise InputError(f"input size must be positive, got {x}")
    return value


def at_size(words: Sequence[str], recorded: str, size: str) -> list[str]:
    """A recorded command's words with its input size `recorded` put at `size`: a word equal to it, and
    `=recorded` inside a word (`--len=384`), replaced."""
    return [size if w == recorded else w.replace("=" + recorded, "=" + size) for w in words]


def size_text(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{float(x):g}"


@dataclass(frozen=True)
class Variant:
    """One request structure and the per-request size laws (index into `TraceSet.laws`, -1 = no size)."""

    sizes: tuple[Fraction, ...]  # recorded input sizes with exactly this structure
    ops: tuple[int, ...]
    streams: tuple[int, ...]
    law: tuple[int, ...]  # per request: law index (alloc / failed alloc), else -1
    owner: tuple[int, ...]  # per request: a free's alloc request index, else -1
    gaps: dict[str, tuple[Gap, ...]] = field(default_factory=dict)  # other recorded size -> unaligned runs
    points: tuple[int, ...] = ()  # per request: how many recordings its law was fitted on


@dataclass(frozen=True)
class Generated:
    """A generated stream and what it rests on."""

    size: Fraction
    trace: Trace
    variant_sizes: tuple[Fraction, ...]  # the recorded sizes whose structure it follows
    extrapolated: bool  # outside the recorded range
    inexact: int  # alloc requests with a table (non-polynomial) law
    unverified: int  # alloc requests whose law no extra point confirmed (or seen at one size only)

    def notes(self) -> list[str]:
        out = []
        if self.extrapolated:
            out.append(f"size {size_text(self.size)} is outside the recorded range: extrapolated")
        if self.inexact:
            out.append(f"{self.inexact} request(s) have no exact law (interpolated between recordings)")
        if self.unverified:
            out.append(f"{self.unverified} request(s) fitted on no spare point (unverified)")
        return out


@dataclass(frozen=True)
class TraceSet:
    """The size-parametric trace of one program (see the module docstring)."""

    sizes: tuple[Fraction, ...]  # every recorded size, ascending
    laws: tuple[Law, ...]
    variants: tuple[Variant, ...]
    total_memory: int | None
    allocator_settings: dict[str, Any]
    meta: dict[str, Any]  # workload, unit, sources, recorded peaks per size
    fallbacks: dict[int, tuple[int, ...]] = field(default_factory=dict)  # variant 0 request -> fallback sizes
    learned: Any = None  # plan.fallible.Learned: fallible workspaces placed on every variant (None: no evidence)

    @property
    def identical(self) -> bool:
        return len(self.variants) == 1

    def variant_for(self, x: Fraction) -> Variant:
        best = min(((abs(s - x), -s, v) for v in self.variants for s in v.sizes), key=lambda t: (t[0], t[1]))
        return best[2]

    def generate(self, x: Any, fallible_inexact: bool = False) -> Generated:
        """The request stream at input size x (a `Trace` with no recorded segment events).

        `fallible_inexact`: treat the requests that look like workspaces as fallible down to
        nothing — the optimistic end of what a program with cuDNN-style workspace fallbacks can
        fit. A workspace is a request without an exact law (a library picked it by shape) or one
        freed by the very next request (allocated for one kernel, as cuDNN's are).
        """
        x = as_size(x)
        v = self.variant_for(x)
        values: dict[int, int] = {}
        sizes = []
        inexact = unverified = 0
        for i, k in enumerate(v.law):
            if k < 0:
                sizes.append(-1)
                continue
            val = values.get(k)
            if val is None:
                val = values[k] = self.laws[k](x)
            sizes.append(val)
            law = self.laws[k]
            if not law.exact:
                inexact += 1
            elif not law.verified:
                unverified += 1
        req = RequestStream()
        req.ops = list(v.ops)
        req.sizes = sizes
        ordinal: dict[int, int] = {}  # alloc request index -> allocation id (0, 1, 2, ... as in a recording)
        rids = []
        for i, op in enumerate(v.ops):
            if op == ALLOC:
                ordinal[i] = len(ordinal)
                rids.append(ordinal[i])
            elif op == FREE:
                rids.append(ordinal.get(v.owner[i], -1 - i))  # a block from before the history: unknown id
            else:
                rids.append(-1)
        req.rids = rids
        req.streams = list(v.streams)
        req.event_index = list(range(len(v.ops)))
        if v is self.variants[0]:
            req.fallbacks = dict(self.fallbacks)
        if self.learned is not None:
            req.fallbacks.update(self.learned.fallbacks(self.variants.index(v), sizes))
        if fallible_inexact:
            for i in workspaces(self, v):
                req.fallbacks.setdefault(i, (0,))
        trace = Trace(
            source=f"{self.meta.get('workload') or 'traceset'}@{size_text(x)}",
            device=0,
            requests=req,
            segment_events=[],
            allocator_settings=dict(self.allocator_settings),
            meta={"generated_size": size_text(x)},
            total_memory=self.total_memory,
        )
        lo, hi = self.sizes[0], self.sizes[-1]
        return Generated(x, trace, v.sizes, not lo <= x <= hi, inexact, unverified)

    def summary(self) -> dict[str, Any]:
        """Counts a user needs to trust (or not) the generated streams."""
        kinds: dict[str, int] = {}
        for v in self.variants[:1]:
            for k in v.law:
                if k < 0:
                    continue
                law = self.laws[k]
                name = (
                    ({"floor": "floor-linear", "floor2": "floor-square"}.get(law.kind) or f"degree {law.degree}")
                    if law.exact
                    else "table (inexact)"
                )
                if law.exact and not law.verified:
                    name += " (unverified)"
                kinds[name] = kinds.get(name, 0) + 1
        return {
            "sizes": [size_text(s) for s in self.sizes],
            "requests": len(self.variants[0].ops),
            "identical_structure": self.identical,
            "variants": [
                {
                    "sizes": [size_text(s) for s in v.sizes],
                    "requests": len(v.ops),
                    "unaligned": {k: [g.to_dict() for g in gs] for k, gs in v.gaps.items() if gs},
                }
                for v in self.variants
            ],
            "laws": dict(sorted(kinds.items())),
            "distinct_laws": len(self.laws),
        }


def workspaces(ts: TraceSet, v: Variant) -> list[int]:
    """Requests of `v` that look like workspaces (see `TraceSet.generate`)."""
    n = len(v.ops)
    out = []
    for i, k in enumerate(v.law):
        if k < 0 or v.ops[i] != ALLOC:
            continue
        if not ts.laws[k].exact or (i + 1 < n and v.ops[i + 1] == FREE and v.owner[i + 1] == i):
            out.append(i)
    return out


def build(recordings: Sequence[tuple[Any, Trace]], meta: dict[str, Any] | None = None) -> TraceSet:
    """Align the recordings (input size, trace) and fit every request's size law."""
    if len(recordings) < 2:
        raise InputError("a size-parametric trace needs recordings at two or more input sizes")
    recs = sorted(((as_size(x), t) for x, t in recordings), key=lambda r: r[0])
    xs = [x for x, _ in recs]
    if len(set(xs)) != len(xs):
        raise InputError(f"two recordings have the same input size: {[size_text(x) for x in xs]}")
    structs = [structure(t.requests) for _, t in recs]
    groups = _variant_groups(structs, xs)
    chain = _Chain(recs, structs, xs)
    laws = _LawTable()
    built = [_variant(g, recs, structs, chain, laws) for g in groups]
    variants = _unified(built, laws)
    first = recs[groups[0][0]][1]
    return TraceSet(
        sizes=tuple(xs),
        laws=tuple(laws.laws),
        variants=tuple(variants),
        total_memory=first.total_memory,
        allocator_settings=dict(first.allocator_settings),
        meta=_meta(meta, recs, first),
        fallbacks=dict(first.requests.fallbacks),
    )


def _variant_groups(structs: Sequence[Any], xs: Sequence[Fraction]) -> list[list[int]]:
    """Recordings of the same structure (same request tokens) grouped; the group with the most
    recordings first: it is the main variant (it carries the fallbacks)."""
    groups: list[list[int]] = []
    for i, st in enumerate(structs):
        for g in groups:
            if structs[g[0]][0] == st[0]:
                g.append(i)
                break
        else:
            groups.append([i])
    groups.sort(key=lambda g: (-len(g), xs[g[0]]))
    return groups


class _Chain:
    """Which request of recording `j` is request i of recording `r`, through the neighbours between.

    Each recording is paired with the next larger one only: between neighbours the size laws have
    the least room to mistake one request for another; farther pairs are their composition."""

    def __init__(self, recs: Sequence[tuple[Fraction, Trace]], structs: Sequence[Any], xs: Sequence[Fraction]):
        self.structs = structs
        self.steps = []
        for k in range(len(recs) - 1):
            a, b = recs[k][1].requests, recs[k + 1][1].requests
            self.steps.append(pair(structs[k], structs[k + 1], (a.sizes, b.sizes), (xs[k], xs[k + 1])).counterpart)
        self.back = []
        for k, cp in enumerate(self.steps):
            inv = [-1] * len(structs[k + 1][0])
            for i, j in enumerate(cp):
                if j >= 0:
                    inv[j] = i
            self.back.append(inv)

    def __call__(self, r: int, j: int) -> list[int]:
        cp = list(range(len(self.structs[r][0])))
        hops = [self.steps[k] for k in range(r, j)] if j > r else [self.back[k] for k in range(r - 1, j - 1, -1)]
        for hop in hops:
            cp = [hop[c] if c >= 0 else -1 for c in cp]
        return cp


class _LawTable:
    """Every distinct law once; requests with the same points share one fit."""

    def __init__(self) -> None:
        self.laws: list[Law] = []
        self.index: dict[tuple[Any, ...], int] = {}
        self.fit_cache: dict[tuple[Any, ...], int] = {}

    def law_for(self, pts: tuple[tuple[Fraction, int], ...]) -> int:
        k = self.fit_cache.get(pts)
        if k is None:
            law = fit([p[0] for p in pts], [p[1] for p in pts])
            k = self.index.get(law.key())
            if k is None:
                k = self.index[law.key()] = len(self.laws)
                self.laws.append(law)
            self.fit_cache[pts] = k
        return k


def _variant(
    g: list[int], recs: Sequence[tuple[Fraction, Trace]], structs: Sequence[Any], chain: _Chain, laws: _LawTable
) -> tuple[Variant, dict[int, tuple[tuple[Fraction, int], ...]]]:
    """One structure's requests with the law of each size, fitted on every recording that has it
    (and the points each request's law was fitted on)."""
    rep = g[0]
    tokens, owner = structs[rep]
    cps: list[tuple[Fraction, list[int], Sequence[int]]] = []
    gaps: dict[str, tuple[Gap, ...]] = {}
    for j, (x, t) in enumerate(recs):
        if j in g:
            cps.append((x, t.requests.sizes, range(len(tokens))))
            continue
        cp = chain(rep, j)
        gaps[size_text(x)] = tuple(gaps_of(cp, len(structs[j][0])))
        cps.append((x, t.requests.sizes, cp))
    ops = recs[rep][1].requests.ops
    law_of = []
    npoints = []
    fitted: dict[int, tuple[tuple[Fraction, int], ...]] = {}
    for i, op in enumerate(ops):
        if op not in (ALLOC, FAILED_ALLOC):
            law_of.append(-1)
            npoints.append(0)
            continue
        pts = tuple((x, sz[cp[i]]) for x, sz, cp in cps if cp[i] >= 0)
        law_of.append(laws.law_for(pts))
        fitted[i] = pts
        npoints.append(len(pts))
    req = recs[rep][1].requests
    return (
        Variant(
            sizes=tuple(recs[j][0] for j in g),
            ops=tuple(ops),
            streams=tuple(req.streams),
            law=tuple(law_of),
            owner=tuple(owner),
            gaps=gaps,
            points=tuple(npoints),
        ),
        fitted,
    )


def _unified(built: list[tuple[Variant, dict[int, tuple[tuple[Fraction, int], ...]]]], laws: _LawTable) -> list[Variant]:
    """Each request's law replaced by an exact law seen at more sizes that passes through every one
    of its points, when there is one.

    Why: a request whose counterparts exist only in some recordings (a structure that differs at
    other sizes) is fitted on fewer points; when those all lie on a grid (sides that are multiples
    of 128) its law cannot see the rounding at other sizes (c * x**2 where the program has
    c' * ceil(x / 4)**2), while its siblings of the same shape, seen at every size, can. Two laws
    with the same values at every size both were seen at are the same tensor as far as any
    recording can tell, and the one that more recordings tested says more about the sizes between
    (seen on timm ResNet-50 at nine sides: a twin of 2048 * ceil(x/4)**2 fitted as 128 * x**2 gave
    the generated stream blocks a hair apart and an uncapped peak 19 % off at side 1081). Where
    several equally rich laws fit, the one asking more just above the recorded sizes (where the
    rounding shows) is kept: the other could only promise less memory than the program may need."""
    seen: dict[int, dict[Fraction, int]] = {}  # law -> every point any request of it was fitted on
    for pts, k in laws.fit_cache.items():
        seen.setdefault(k, {}).update(pts)
    rich = [(len(p), k) for k, p in seen.items() if laws.laws[k].exact]
    choice: dict[tuple[tuple[Fraction, int], ...], int] = {}
    out = []
    for v, fitted in built:
        law = list(v.law)
        points = list(v.points)
        for i, pts in fitted.items():
            if pts not in choice:
                choice[pts] = _richer(pts, laws.fit_cache[pts], seen, rich, laws)
            k = choice[pts]
            if k != law[i]:
                law[i], points[i] = k, len(seen[k])
        out.append(Variant(v.sizes, v.ops, v.streams, tuple(law), v.owner, v.gaps, tuple(points)))
    return out


def _richer(
    pts: tuple[tuple[Fraction, int], ...],
    own: int,
    seen: dict[int, dict[Fraction, int]],
    rich: list[tuple[int, int]],
    laws: _LawTable,
) -> int:
    """`_unified`'s choice for one request fitted on `pts` (its own law `own` when none is richer). A request
    seen at one size only keeps its own law: any law through one point would do, which is no evidence."""
    if len(pts) < 2:
        return own
    fits = [(n, k) for n, k in rich if n > len(pts) and k != own and all(seen[k].get(x) == y for x, y in pts)]
    if not fits:
        return own
    most = max(n for n, _ in fits)
    probe = [x + 1 for x, _ in pts]  # just above each recorded size: where a stride's rounding shows
    return max((k for n, k in fits if n == most), key=lambda k: (sum(laws.laws[k](x) for x in probe), -k))


def _meta(meta: dict[str, Any] | None, recs: Sequence[tuple[Fraction, Trace]], first: Trace) -> dict[str, Any]:
    """The given metadata, completed with the sources, recorded peaks and workload name."""
    meta = dict(meta or {})
    meta.setdefault("sources", {size_text(x): t.source for x, t in recs})
    peaks = {size_text(x): _recorded_peak(t) for x, t in recs}
    meta.setdefault("recorded_peak_reserved", {k: v for k, v in peaks.items() if v is not None})
    commands = {size_text(x): _command(t.meta) for x, t in recs if _command(t.meta)}
    if commands:
        meta.setdefault("commands", commands)  # the program's command per size (record's sidecar): for hints
    if "workload" not in meta and first.meta.get("workload"):
        meta["workload"] = first.meta["workload"]
    return meta


def _command(meta: dict[str, Any]) -> list[str] | None:
    """The recorded command: record's sidecar `command`, else a `workload` that is a command line."""
    import shlex

    cmd = meta.get("command")
    if isinstance(cmd, list) and all(isinstance(w, str) for w in cmd):
        return cmd
    workload = meta.get("workload")
    if isinstance(workload, str) and " " in workload:
        try:
            return shlex.split(workload)
        except ValueError:
            return None
    return None


def _recorded_peak(trace: Trace) -> int | None:
    """The recording's own peak reserved bytes (the sidecar's memory_stats), when it has one."""
    stats = trace.meta.get("stats") if isinstance(trace.meta, dict) else None
    if isinstance(stats, dict) and isinstance(stats.get("reserved_bytes.all.peak"), int):
        return int(stats["reserved_bytes.all.peak"])
    return None
