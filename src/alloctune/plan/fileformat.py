"""The `.atraceset` file: a size-parametric trace, compact, versioned, pickle-free.

gzip-compressed JSON. Each distinct size law is stored once (`laws`); a variant stores its
requests as columns: `ops` as one digit string, `streams` run-length encoded, the law index
of each sized request, and for each free the distance back to the alloc it releases. The
format name and version are checked on load; anything else is a one-line `TraceError`.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from alloctune.errors import TraceError
from alloctune.plan.align import Gap
from alloctune.plan.fit import Law
from alloctune.plan.traceset import TraceSet, Variant, as_size
from alloctune.trace.model import ALLOC, FAILED_ALLOC, FREE

FORMAT = "alloctune.traceset"
VERSION = 1
SUFFIX = ".atraceset"


def to_dict(ts: TraceSet) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "sizes": [str(s) for s in ts.sizes],
        "total_memory": ts.total_memory,
        "allocator_settings": ts.allocator_settings,
        "meta": ts.meta,
        "laws": [law.to_json() for law in ts.laws],
        "fallbacks": {str(k): list(v) for k, v in ts.fallbacks.items()},
        "variants": [_variant_dict(v) for v in ts.variants],
        "learned": ts.learned.to_dict() if ts.learned is not None else None,  # plan.fallible: learned once, kept
    }


def _variant_dict(v: Variant) -> dict[str, Any]:
    return {
        "sizes": [str(s) for s in v.sizes],
        "ops": "".join(str(op) for op in v.ops),
        "streams": _rle(list(v.streams)),
        "law": [k for k in v.law if k >= 0],
        "points": [p for k, p in zip(v.law, v.points) if k >= 0],
        "free_back": [i - o if o >= 0 else 0 for i, (op, o) in enumerate(zip(v.ops, v.owner)) if op == FREE],
        "gaps": {k: [[g.start, g.stop, g.other_start, g.other_stop] for g in gs] for k, gs in v.gaps.items()},
    }


def from_dict(d: dict[str, Any], source: str = "<traceset>") -> TraceSet:
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise TraceError(f"{source}: not an alloctune size-parametric trace set (no format {FORMAT!r})")
    if d.get("version") != VERSION:
        raise TraceError(
            f"{source}: trace set version {d.get('version')!r} is not supported (this alloctune reads {VERSION}); "
            "rebuild it with alloctune plan ... --save"
        )
    try:
        laws = tuple(Law.from_json(row) for row in d["laws"])
        variants = tuple(_variant_from(v, len(laws)) for v in d["variants"])
        ts = TraceSet(
            sizes=tuple(sorted(as_size(s) for s in d["sizes"])),
            laws=laws,
            variants=variants,
            total_memory=d.get("total_memory"),
            allocator_settings=dict(d.get("allocator_settings") or {}),
            meta=dict(d.get("meta") or {}),
            fallbacks={int(k): tuple(int(s) for s in v) for k, v in (d.get("fallbacks") or {}).items()},
            learned=_learned_from(d.get("learned"), variants),
        )
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise TraceError(f"{source}: the trace set is damaged ({type(exc).__name__}: {exc})") from None
    if not variants:
        raise TraceError(f"{source}: the trace set has no request structure")
    return ts


def _learned_from(d: Any, variants: tuple[Variant, ...]) -> Any:
    """The learned fallible requests (plan.fallible), each index checked against its variant."""
    if d is None:
        return None
    from alloctune.plan.fallible import Learned

    learned = Learned.from_dict(d)
    for sites, v in zip(learned.sites, variants):
        if any(not 0 <= i < len(v.ops) for i in sites):
            raise ValueError("a learned fallible request lies outside its structure")
    return learned


def _variant_from(d: dict[str, Any], n_laws: int) -> Variant:
    ops = tuple(int(c) for c in d["ops"])
    if any(op not in (0, 1, 2, 3) for op in ops):
        raise ValueError("unknown request kind")
    streams = _unrle(d["streams"])
    laws_it = iter(d["law"])
    points_it = iter(d.get("points") or [])
    back_it = iter(d["free_back"])
    law, owner, points = [], [], []
    for i, op in enumerate(ops):
        if op in (ALLOC, FAILED_ALLOC):
            k = int(next(laws_it))
            if not 0 <= k < n_laws:
                raise IndexError(f"law index {k} out of range")
            law.append(k)
            points.append(int(next(points_it, 0)))
            owner.append(-1)
        elif op == FREE:
            back = int(next(back_it))
            law.append(-1)
            points.append(0)
            owner.append(i - back if 0 < back <= i else -1)
        else:
            law.append(-1)
            points.append(0)
            owner.append(-1)
    if len(streams) != len(ops):
        raise ValueError("streams and ops differ in length")
    gaps = {k: tuple(Gap(*map(int, g)) for g in gs) for k, gs in (d.get("gaps") or {}).items()}
    return Variant(tuple(as_size(s) for s in d["sizes"]), ops, tuple(streams), tuple(law), tuple(owner), gaps, tuple(points))


def save(ts: TraceSet, path: str | Path) -> int:
    """Write the trace set; returns the file size in bytes."""
    data = gzip.compress(json.dumps(to_dict(ts), separators=(",", ":")).encode(), compresslevel=6, mtime=0)
    Path(path).write_bytes(data)
    return len(data)


def load(path: str | Path) -> TraceSet:
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace set ({exc.strerror or exc})") from None
    try:
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        d = json.loads(text)
    except (OSError, EOFError, ValueError) as exc:
        raise TraceError(f"{path}: not a readable trace set ({type(exc).__name__}: {exc})") from None
    return from_dict(d, str(path))


def is_traceset(path: str | Path) -> bool:
    """True when the file is a trace set (by its content, not only its suffix)."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
        if head == b"\x1f\x8b":
            with gzip.open(path, "rb") as g:
                head = g.read(200)
        else:
            with open(path, "rb") as f:
                head = f.read(200)
    except (OSError, EOFError):
        return False
    return FORMAT.encode() in head


def _rle(xs: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for x in xs:
        if out and out[-1][0] == x:
            out[-1][1] += 1
        else:
            out.append([x, 1])
    return out


def _unrle(runs: list[list[int]]) -> list[int]:
    out: list[int] = []
    for value, count in runs:
        if count < 0:
            raise ValueError("negative run length")
        out.extend([int(value)] * int(count))
    return out


__all__ = ["FORMAT", "VERSION", "SUFFIX", "save", "load", "to_dict", "from_dict", "is_traceset"]
