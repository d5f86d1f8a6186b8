"""Fallible workspaces learned once and placed by position in a size-parametric trace.

Why: a convolution program asks cuDNN for workspaces that it gives up under memory pressure
(another algorithm, a smaller workspace or none). Without knowing which requests those are,
`plan` can only bracket the answer: every workspace-shaped request fixed (conservative) or
every one given up (optimistic). The evidence that decides it is per *request of the program*,
not per byte count (the byte counts change with the input size), so each kind of evidence is
turned into request indices of one stream of the program and placed on the trace set's
structures by aligning that stream with each of them (`plan.align.pair`):

* **calibration**: a run of the same program under a cap whose workspaces failed and that went
  on; `trace.fallible.learn_from_calibration` against the uncapped stream at the same input
  size (the recording at that size, or the stream the trace set generates there) gives each
  failed request and what it settled on;
* **frames**: a recording with C++ stacks; a request allocated inside cuDNN's plan loop is a
  workspace (`trace.fallible.tag_by_frames`), which can always run without one;
* **store**: a `tune` store of the same program: its uncapped recorded run and each capped
  recorded run that survived OOMs are a calibration pair.

What a fallible request settles on is kept relative to its size (a workspace of 40 % of the
request at the calibration's size is 40 % at every size); a settled size of at most `SMALL`
bytes (no workspace, or a few KiB) is kept as is. Where that fails too, the request runs
without a workspace (cuDNN always has such an algorithm; `trace.fallible.NO_WORKSPACE`).
Pure Python: no torch.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from alloctune.errors import InputError
from alloctune.plan.align import Token, pair, structure
from alloctune.trace.fallible import NO_WORKSPACE, SCRATCH_MIN, has_cpp_frames, learn_from_calibration, tag_by_frames
from alloctune.trace.model import ALLOC, EMPTY_CACHE, FAILED_ALLOC, FREE, RequestStream, Trace
from alloctune.units import MiB, format_size

if TYPE_CHECKING:
    from alloctune.plan.traceset import TraceSet, Variant

SCHEMA = "alloctune.plan_fallible/1"
SMALL = 1 * MiB  # a settled size this small (no workspace, a few KiB) does not scale with the input
STORE_LINES = 100_000  # a tune store holds one line per trial: more is not a store


@dataclass(frozen=True)
class Evidence:
    """One piece of evidence and what it taught."""

    kind: str  # calibration | frames | store
    source: str
    size: str | None  # input size it was recorded at (None: unknown, a store's program)
    cap: int | None  # the cap of a calibration run
    learned: int  # fallible requests it showed in its own stream
    placed: int  # of those, placed on the trace set's main structure
    same_kind: int = 0  # further requests of the same shape taken as fallible too (`_same_kind`)

    def text(self) -> str:
        at = f" at size {self.size}" if self.size else ""
        cap = f" capped at {format_size(self.cap)}" if self.cap else ""
        what = {"calibration": "a calibration run", "frames": "C++ frames of a recording", "store": "a tune store's capped runs"}[
            self.kind
        ]
        kind = f", {self.same_kind} more of the same shape" if self.same_kind else ""
        return (
            f"{what}{at}{cap} ({Path(self.source).name}): {self.learned} fallible request(s), "
            f"{self.placed} placed on these recordings{kind}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "text": self.text()}


@dataclass(frozen=True)
class Learned:
    """Per structure (variant) of a trace set: request index -> what it settles on (see `SMALL`)."""

    sites: tuple[Mapping[int, Any], ...]
    evidence: tuple[Evidence, ...] = ()

    @property
    def requests(self) -> int:
        return len(self.sites[0]) if self.sites else 0

    @property
    def decided_by(self) -> str:
        return "+".join(sorted({e.kind for e in self.evidence if e.placed})) or "none"

    def fallbacks(self, variant: int, sizes: Sequence[int]) -> dict[int, tuple[int, ...]]:
        """The fallback ladders of one generated stream (its request sizes)."""
        out: dict[int, tuple[int, ...]] = {}
        for i, rule in (self.sites[variant] if variant < len(self.sites) else {}).items():
            size = sizes[i]
            settled = rule if isinstance(rule, int) else max(NO_WORKSPACE, math.ceil(rule * size))
            if size > NO_WORKSPACE and settled < size:
                out[i] = (settled, NO_WORKSPACE) if settled > NO_WORKSPACE else (settled,)
        return out

    def merged(self, other: "Learned") -> "Learned":
        """Both pieces of evidence; where both name a request, this one's rule is kept (`learn` merges
        later evidence over earlier, so a calibration's rule wins over frames' "no workspace")."""
        sites = tuple({**b, **a} for a, b in zip(_pad(self.sites, other.sites), _pad(other.sites, self.sites)))
        return Learned(sites, self.evidence + other.evidence)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "decided_by": self.decided_by,
            "requests": self.requests,
            "evidence": [e.to_dict() for e in self.evidence],
            "sites": [{str(i): _rule_json(r) for i, r in sorted(s.items())} for s in self.sites],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Learned":
        """Read back `to_dict` (a saved trace set); ValueError on anything it could not have written."""
        sites = tuple({int(i): _rule_from(r) for i, r in s.items()} for s in d.get("sites") or ())
        keys = ("kind", "source", "size", "cap", "learned", "placed", "same_kind")
        evidence = tuple(Evidence(**{k: e[k] for k in keys}) for e in d.get("evidence") or ())
        for e in evidence:
            counts = (e.learned, e.placed, e.same_kind) + ((e.cap,) if e.cap is not None else ())
            known = e.kind in ("calibration", "frames", "store")
            if not known or not all(isinstance(n, int) and n >= 0 for n in counts):
                raise ValueError("learned fallible requests: damaged evidence")
        return cls(sites, evidence)


def _pad(a: Sequence[Mapping[int, Any]], b: Sequence[Mapping[int, Any]]) -> list[Mapping[int, Any]]:
    return list(a) + [{}] * max(0, len(b) - len(a))


def _rule_json(rule: Any) -> Any:
    return rule if isinstance(rule, int) else f"{rule.numerator}/{rule.denominator}"


def _rule_from(value: Any) -> Any:
    rule = int(value) if isinstance(value, int) else Fraction(str(value))
    if not (0 <= rule <= SMALL if isinstance(rule, int) else 0 < rule < 1):
        raise ValueError(f"learned fallible requests: a fallback of {value!r} is not one")
    return rule


# ---- placing one stream's fallible requests on the trace set's structures -----------------------------
def _variant_structure(v: "Variant") -> tuple[list[Token], list[int]]:
    tokens: list[Token] = [(op,) if op == EMPTY_CACHE else (op, s) for op, s in zip(v.ops, v.streams)]
    return tokens, list(v.owner)


def place(ts: "TraceSet", stream: Trace, rules: Mapping[int, Any]) -> tuple[dict[int, Any], ...]:
    """`rules` (request index of `stream` -> settled rule) as request indices of every variant of
    `ts`, through the alignment of `stream` with each variant's structure (requests without a
    counterpart are left out: the evidence says nothing about them). A request of the variant with
    the same size law as a placed one is the same kind of request (a layer of the same shape met
    again, its workspace chosen by the same rule) and gets the same rule: the evidence only saw the
    ones its cap pressed."""
    if not rules:
        return tuple({} for _ in ts.variants)
    own = structure(stream.requests)
    out = []
    for v in ts.variants:
        cp = pair(own, _variant_structure(v)).counterpart
        placed = {cp[i]: r for i, r in rules.items() if i < len(cp) and cp[i] >= 0 and v.ops[cp[i]] == ALLOC}
        by_law: dict[int, Any] = {}
        for j, r in placed.items():
            by_law.setdefault(v.law[j], r)
        for j, (op, k) in enumerate(zip(v.ops, v.law)):
            if op == ALLOC and k in by_law and j not in placed:
                placed[j] = by_law[k]
        out.append(placed)
    return tuple(out)


def _relative(stream: Trace, ladders: Mapping[int, tuple[int, ...]]) -> dict[int, Any]:
    """The settled size of each ladder as a rule: absolute when small, else a fraction of the request."""
    sizes = stream.requests.sizes
    out: dict[int, Any] = {}
    for i, ladder in ladders.items():
        settled = int(ladder[-1]) if ladder else NO_WORKSPACE
        out[i] = settled if settled <= SMALL or not sizes[i] else Fraction(settled, sizes[i])
    return out


# ---- the three kinds of evidence --------------------------------------------------------------------
def from_calibration(
    ts: "TraceSet",
    capped: Trace,
    size: Any,
    uncapped: Trace | None = None,
    source: str = "calibration",
    kind: str = "calibration",
) -> Learned:
    """What a capped run of the program at input `size` gave up. `uncapped`: the same program
    uncapped at that size (default: the stream the trace set generates there, whose structure
    is one of its own)."""
    from alloctune.plan.traceset import size_text

    x = None
    if uncapped is None:
        if size is None:
            raise InputError(f"{source}: give the input size the calibration ran at (FILE:SIZE)")
        gen = ts.generate(size)
        uncapped, x = gen.trace, gen.size
        model = learn_from_calibration(uncapped, capped)
        own = as_uncapped(capped)
        mine = learn_from_calibration(own, capped)
        if mine.aligned_requests > model.aligned_requests:  # the generated sizes lost track of the run
            uncapped, model = own, mine
    else:
        model = learn_from_calibration(uncapped, capped)
    placed = place(ts, uncapped, _relative(uncapped, model.sites))
    sites = tuple(_same_kind(ts, v, p) for v, p in zip(ts.variants, placed))
    return Learned(
        sites,
        (
            Evidence(
                kind,
                source,
                size_text(x) if x is not None else _text(size),
                model.calibration_cap,
                len(model.sites),
                len(placed[0]),
                len(sites[0]) - len(placed[0]),
            ),
        ),
    )


def as_uncapped(capped: Trace) -> Trace:
    """The calibration run as its program would have run it uncapped: each run of failed requests
    becomes the request that failed (the replacement allocation, when one follows, takes its place
    and its allocation id; else the request is freed at once, a workspace used by one kernel).

    Why: a calibration is matched request by request, byte count by byte count, against the
    uncapped stream at its size. Where no recording exists at that size the trace set generates
    one, and wherever a law is inexact there (a convolution's workspace chosen by shape, an image
    side that is not a multiple of the network's stride) no byte count matches and nothing is
    learned (seen: timm at side 818 recorded at 256/384/512: 40 fallbacks, 0 learned). The run
    itself holds the program's exact requests up to its failures, and each failure names the size
    the program asked for first."""
    from copy import copy

    src = capped.requests
    out = RequestStream()
    next_rid = max((r for r in src.rids), default=0) + 1
    i, n = 0, len(src.ops)
    while i < n:
        op = src.ops[i]
        if op != FAILED_ALLOC:
            out.append(op, src.sizes[i], src.rids[i], src.streams[i], src.event_index[i])
            i += 1
            continue
        first, stream, ev = src.sizes[i], src.streams[i], src.event_index[i]
        while i < n and src.ops[i] == FAILED_ALLOC:
            i += 1
        if i < n and src.ops[i] == ALLOC and src.sizes[i] < first:  # what it settled on takes the request's place
            out.append(ALLOC, first, src.rids[i], stream, ev)
            i += 1
        else:  # ran without it (or died): the request, freed by the kernel that used it
            out.append(ALLOC, first, next_rid, stream, ev)
            out.append(FREE, first, next_rid, stream, ev)
            next_rid += 1
    trace = copy(capped)
    trace.requests = out
    return trace


def died(
    calibrations: Sequence[tuple[Any, Trace, str]], recordings: Sequence[tuple[Any, Trace]] = ()
) -> list[tuple[Any, int | None, bool]]:
    """The calibrations whose program died: (input size, cap, expandable segments). A real run that died
    is a fact about its size under its cap (`plan.answer._below_real_failure`)."""
    out = []
    for x, run, _source in calibrations:
        if x is None or FAILED_ALLOC not in run.requests.ops or _completed(run, x, recordings) is not False:
            continue
        cap = (run.meta or {}).get("cap") or (run.meta or {}).get("oom_limit")
        settings = run.allocator_settings or {}
        out.append((x, int(cap) if cap else None, bool(settings.get("expandable_segments"))))
    return out


def _completed(run: Trace, size: Any, recordings: Sequence[tuple[Any, Trace]]) -> bool | None:
    """Whether a capped run went to its end: its recorded outcome, else whether its stream made uncapped
    reaches the last allocation of the recording nearest its input `size` (a run that died stops where it failed and
    frees; one that survived its fallbacks goes on like the program). None: nothing to tell by."""
    from alloctune.plan.traceset import as_size

    outcome = (run.meta or {}).get("outcome")
    if outcome in ("ok", "oom"):
        return bool(outcome == "ok")
    if not recordings:
        return None
    near = min(recordings, key=lambda r: abs(as_size(r[0]) - as_size(size)))[1]
    ops = near.requests.ops
    last = max((i for i, op in enumerate(ops) if op == ALLOC), default=-1)
    counterpart = pair(structure(as_uncapped(run).requests), structure(near.requests)).counterpart
    return last in set(counterpart)


def survived(calibrations: Sequence[tuple[Any, Trace, str]], recordings: Sequence[tuple[Any, Trace]]) -> list[tuple[Any, Trace]]:
    """The calibrations the program survived, as recordings of it at their sizes (`as_uncapped`): a run
    that went to its end (`_completed`) and that the alignment with its own uncapped form explains
    whole, at a size with no recording of its own.

    Why: such a run is the program's complete request stream at that size, up to which workspaces fell
    back; where the recordings all lie on a grid (timm sides 256, 384, 512), one at another size (818)
    is what shows the laws the rounding between (see `plan.fit`'s floor-square law)."""
    from alloctune.plan.traceset import as_size

    have = {as_size(x) for x, _ in recordings}
    out = []
    for x, run, _source in calibrations:
        if x is None or as_size(x) in have or FAILED_ALLOC not in run.requests.ops:
            continue
        if not _completed(run, x, recordings):
            continue
        own = as_uncapped(run)
        if learn_from_calibration(own, run).unaligned_requests:
            continue
        have.add(as_size(x))
        out.append((x, own))
    return out


def _same_kind(ts: "TraceSet", v: "Variant", placed: dict[int, Any]) -> dict[int, Any]:
    """`placed` and every other request of `v` shaped like the workspaces a calibration saw fall back.

    Why: a cap presses only the requests at the program's peak, so a calibration sees one or two of
    its workspaces fail (HuBERT under a cap: the largest of its seven convolution workspaces), while
    a larger input under the target's cap presses the others too. Having seen the program give up a
    workspace, the requests of the same shape are taken as the same kind: freed by the very next
    request (used by one kernel), at least `SCRATCH_MIN` bytes at the largest recorded size, and
    growing with the input (a fixed-size buffer is not chosen by shape). They settle on what the
    calibrated ones did (no workspace when all of those settled small, else the largest fraction seen).
    Frames need no such step: they name every workspace."""
    if not placed:
        return placed
    fractions = [r for r in placed.values() if not isinstance(r, int)]
    rule: Any = max(fractions) if fractions else NO_WORKSPACE
    top = max(v.sizes)
    out = dict(placed)
    n = len(v.ops)
    for i, (op, k) in enumerate(zip(v.ops, v.law)):
        if op != ALLOC or k < 0 or i in out or not (i + 1 < n and v.ops[i + 1] == FREE and v.owner[i + 1] == i):
            continue
        law = ts.laws[k]
        grows = law.kind in ("floor", "floor2") or (law.kind == "poly" and law.degree >= 1) or law.kind == "table"
        if grows and law(top) >= SCRATCH_MIN:
            out[i] = rule
    return out


def from_frames(ts: "TraceSet", trace: Trace, size: Any, source: str = "recording") -> Learned | None:
    """The workspaces a recording with C++ frames shows (None: it has no C++ frames)."""
    if not has_cpp_frames(trace):
        return None
    tagged = {i: NO_WORKSPACE for i in tag_by_frames(trace)}
    sites = place(ts, trace, tagged)
    return Learned(sites, (Evidence("frames", source, _text(size), None, len(tagged), len(sites[0])),))


def from_store(ts: "TraceSet", path: str | Path, load: Any = None) -> Learned:
    """Every capped recorded run of a `tune` store that survived OOMs, against its uncapped recorded run.

    `load`: the trace loader (default `trace.load.load_trace`)."""
    if load is None:
        from alloctune.trace.load import load_trace as load
    trials = _store_trials(Path(path))
    base = next((t for t in trials if t.get("budget") is None and t.get("snapshot") and t.get("outcome") == "ok"), None)
    if base is None:
        raise InputError(f"{path}: the tune store has no uncapped recorded run of the program to learn against")
    uncapped = load(_snapshot(path, base["snapshot"]))
    out = Learned(tuple({} for _ in ts.variants))
    for t in trials:
        if t.get("budget") and t.get("snapshot") and t.get("num_ooms") and t.get("outcome") == "ok":
            capped = load(_snapshot(path, t["snapshot"]))
            part = from_calibration(ts, capped, None, uncapped, source=str(path), kind="store")
            e = part.evidence[0]
            part = Learned(part.sites, (Evidence("store", str(path), None, int(t["budget"]), e.learned, e.placed, e.same_kind),))
            out = part.merged(out)
    if not out.evidence:
        raise InputError(f"{path}: the tune store has no capped recorded run that survived an OOM (nothing fell back)")
    return out


def _snapshot(store: str | Path, name: str) -> Path:
    """A recorded run named in a store: as written (tune's working directory), else beside the store."""
    p = Path(name)
    if p.is_file():
        return p
    beside = Path(store).parent / p
    if beside.is_file():
        return beside
    raise InputError(f"--store {store}: the recorded run {name} it names is gone (tune's work directory was removed?)")


def _store_trials(path: Path) -> list[dict[str, Any]]:
    """The trial results of a tune store (JSON lines, `tune.store`'s format), damaged lines skipped."""
    if not path.is_file():
        raise InputError(f"--store {path}: no such file")
    trials = []
    with path.open("rb") as fh:
        for n, line in enumerate(fh):
            if n >= STORE_LINES:
                raise InputError(f"--store {path}: more than {STORE_LINES} lines: not a tune store")
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("kind") == "trial" and isinstance(rec.get("result"), dict):
                trials.append(rec["result"])
    if not trials:
        raise InputError(f"--store {path}: no trial in it (a tune store is written by alloctune tune --store)")
    return trials


def _text(size: Any) -> str | None:
    from alloctune.plan.traceset import as_size, size_text

    return size_text(as_size(size)) if size is not None else None


def learn(
    ts: "TraceSet",
    recordings: Sequence[tuple[Any, Trace]] = (),
    calibrations: Sequence[tuple[Any, Trace, str]] = (),
    store: str | Path | None = None,
) -> Learned | None:
    """Every kind of evidence given, merged (None: none taught anything). `recordings`: the trace
    set's own (size, trace) pairs, read for C++ frames; `calibrations`: (size or None, run, source
    name), a capped run whose requests failed (the uncapped counterpart is the recording at that size
    when there is one) and/or a run with C++ stacks (placed by alignment, whatever its input)."""
    from alloctune.plan.traceset import as_size

    by_size = {as_size(x): t for x, t in recordings}
    out: Learned | None = None
    parts: list[Learned] = []
    for x, trace in recordings:
        part = from_frames(ts, trace, x, str(trace.source))
        if part is not None:
            parts.append(part)
    for x, run, source in calibrations:
        frames = from_frames(ts, run, x, source)  # a run with C++ stacks names its workspaces itself
        if frames is not None:
            parts.append(frames)
        if FAILED_ALLOC in run.requests.ops:
            uncapped = by_size.get(as_size(x)) if x is not None else None
            parts.append(from_calibration(ts, run, x, uncapped, source))
    if store is not None:
        parts.append(from_store(ts, store))
    for part in parts:  # later parts first: a calibration overrides frames' "no workspace"
        out = part if out is None else part.merged(out)
    return out


# ---- when nothing decides it: what to record ---------------------------------------------------------
def record_hint(ts: "TraceSet", size: str, budget: int) -> str:
    """The exact commands that make a bracketed answer one number: a calibration run at the size in
    question under the target's budget, then plan with it."""
    from alloctune.units import format_size_arg

    cmd = _command_at(ts, size)
    name = f"calibration-{size}.pickle.xz"
    return (
        f"alloctune run --budget {format_size_arg(budget)} --record {name} -- {cmd}, then plan again with "
        f"--calibration {name}:{size} (or record once at that size with --stacks all)"
    )


def _command_at(ts: "TraceSet", size: str) -> str:
    """The recorded program's command at `size` (its recorded size replaced), when a sidecar kept it."""
    from alloctune.plan.traceset import at_size

    commands = ts.meta.get("commands") or {}
    for recorded, cmd in commands.items():
        if isinstance(cmd, list) and cmd:
            words = at_size(cmd, recorded, size)
            if words != cmd:
                if words[0].endswith(".py"):  # a script recorded without its interpreter: the line must run
                    words = ["python", *words]
                return shlex.join(words)
    return f"<the program at size {size}>"


__all__ = [
    "Evidence",
    "Learned",
    "learn",
    "as_uncapped",
    "died",
    "survived",
    "from_calibration",
    "from_frames",
    "from_store",
    "place",
    "record_hint",
    "SMALL",
]
