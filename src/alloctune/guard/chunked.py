"""`chunked`: run a function over pieces of a long input, shrinking a piece only when it OOMs.

Long audio, long sequences and big batches OOM because one activation grows with the input.
Running the model over pieces along that axis bounds the peak, but fixed small pieces waste
time on a card that could take the whole input. So `chunked` starts with the whole input (or
the size that last worked for inputs of this shape), halves only the piece that failed,
keeps every finished piece, remembers the largest piece that worked per input-shape key,
and doubles the piece again after `grow_after` successes in a row, because an OOM can be
transient (another request's cache, fragmentation). When a grown-back piece fails again the
run of successes needed before the next try doubles, so a hard limit costs a few failed
attempts per call, not one every `grow_after` pieces.

Joining pieces (`blend`):

* ``"trim"`` (default): each piece is computed with `overlap` positions of context on both
  sides and only its centre is kept. For a model whose receptive field reaches at most
  `overlap` positions to either side (convolutions, local attention) the result equals the
  unchunked call up to floating-point rounding.
* ``"crossfade"``: consecutive pieces share `overlap` positions and are blended with linear
  ramps (a convex combination: a pointwise model gives exactly the unchunked result). For
  models whose outputs need a smooth seam rather than exactness (noise sources, vocoders).
* ``"add"``: overlap-add; shared positions are summed. For functions that window their
  output themselves (ISTFT-style synthesis).

Output length along `out_dim` must be ``window_length * ratio`` for every piece (e.g.
``ratio=480`` for a vocoder with hop 480, ``ratio=Fraction(1, 320)`` with ``align=320`` for a
stride-320 encoder). Positions and sizes are multiples of `align`.

    @chunked(dim=-1, overlap=16_000, min_chunk=48_000)
    def convert(audio): return model(audio)

    y = convert(audio)             # same as model(audio), never OOMs above 3 s pieces
    convert.last_run               # ChunkRun: pieces, halvings, final size, ...
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from alloctune.guard.counters import stats
from alloctune.guard.oom import is_oom, oom_kind, strip_traceback
from alloctune.guard.record import GuardRecord
from alloctune.guard.release import release_cached
from alloctune.units import format_size

__all__ = ["chunked", "Chunker", "ChunkRun", "ChunkMemo"]

log = logging.getLogger("alloctune.guard")

_BLENDS = ("trim", "crossfade", "add")


@dataclass(frozen=True)
class ChunkMemo(GuardRecord):
    """What is known for one input-shape key: the largest piece that worked, the smallest that OOMed."""

    largest_ok: int = 0
    smallest_failed: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ChunkMemo":
        failed = data.get("smallest_failed")
        return cls(int(data["largest_ok"]), None if failed is None else int(failed))


@dataclass(frozen=True)
class ChunkRun(GuardRecord):
    """One call: how the input was cut and what it cost."""

    key: str
    length: int
    start_chunk: int
    final_chunk: int
    pieces: int
    calls: int
    halvings: int
    grow_backs: int
    released_bytes: int


def _as_ratio(ratio: int | Fraction | str) -> Fraction:
    r = Fraction(ratio)
    if r <= 0:
        raise ValueError(f"ratio must be > 0, got {ratio!r}")
    return r


class Chunker:
    """The engine behind `@chunked`; also usable directly: `Chunker(dim=1).run(fn, x)`.

    dim: axis cut in the first `inputs` positional arguments (all must share its length);
        the remaining arguments are passed to every call unchanged.
    overlap, blend: context / shared positions per piece and how pieces join (module doc).
    min_chunk: smallest piece tried; an OOM on a piece that cannot be halved above it
        re-raises the original error.
    start: first piece size when nothing is remembered (default: the whole input).
    align, ratio, out_dim: piece positions are multiples of `align`; the output has
        `ratio` positions per input position along `out_dim` (default: `dim`).
    grow_after: successes in a row before a piece size is doubled again.
    key: extra hashable added to the memo key, or a callable `key(*args, **kwargs)`
        returning the whole key (default: shape without `dim`, dtype, device).
    out_device: where the joined output lives (default: where the pieces come out).
    cleanup: True = `gc.collect()` + `empty_cache()` after an OOM; False; or a callable
        returning bytes released.
    """

    def __init__(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        dim: int = -1,
        overlap: int = 0,
        blend: str = "trim",
        min_chunk: int = 1,
        start: int | None = None,
        align: int = 1,
        ratio: int | Fraction | str = 1,
        out_dim: int | None = None,
        grow_after: int = 4,
        inputs: int = 1,
        key: Hashable | Callable[..., Hashable] | None = None,
        out_device: Any = None,
        cleanup: bool | Callable[[], int] = True,
    ) -> None:
        if blend not in _BLENDS:
            raise ValueError(f"blend must be one of {_BLENDS}, got {blend!r}")
        for name, value, low in (
            ("overlap", overlap, 0),
            ("min_chunk", min_chunk, 1),
            ("align", align, 1),
            ("grow_after", grow_after, 1),
            ("inputs", inputs, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if start is not None and (not isinstance(start, int) or start < 1):
            raise ValueError(f"start must be a positive int or None, got {start!r}")
        self.ratio = _as_ratio(ratio)
        if (align * self.ratio).denominator != 1:
            raise ValueError(f"align ({align}) times ratio ({self.ratio}) must be a whole number of output positions")
        if overlap % align:
            raise ValueError(f"overlap ({overlap}) must be a multiple of align ({align})")
        if blend != "trim" and overlap == 0:
            blend = "trim"  # nothing to blend: identical to butt-joining pieces
        self.fn = fn
        self.dim = dim
        self.overlap = overlap
        self.blend = blend
        self.min_chunk = max(min_chunk, align)
        self.start = start
        self.align = align
        self.out_dim = out_dim
        self.grow_after = grow_after
        self.inputs = inputs
        self.key = key
        self.out_device = out_device
        if cleanup is True:
            self._cleanup: Callable[[], int] | None = release_cached
        elif cleanup is False or cleanup is None:
            self._cleanup = None
        else:
            self._cleanup = cleanup
        self.memo: dict[Hashable, ChunkMemo] = {}
        self.last_run: ChunkRun | None = None
        self._lock = threading.Lock()
        if fn is not None:
            functools.update_wrapper(self, fn)

    # -- public -------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fn is None:
            raise TypeError("this Chunker has no function; use .run(fn, *args) or decorate one")
        return self.run(self.fn, *args, **kwargs)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call `fn(*pieces, *rest, **kwargs)` piece by piece and return the joined output."""
        out, report = self._run(fn, args, kwargs)
        self.last_run = report
        return out

    def run_with_report(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, ChunkRun]:
        """Like `run`, also returning this call's `ChunkRun` (thread-safe, unlike `last_run`)."""
        return self._run(fn, args, kwargs)

    def plan(self, key: Hashable, length: int) -> int:
        """The piece size a call with this key and length starts with."""
        with self._lock:
            memo = self.memo.get(key)
        if memo is not None and memo.smallest_failed is not None and memo.largest_ok:
            size = memo.largest_ok
        elif self.start is not None:
            size = self.start
        else:
            size = length
        size = min(size, length)
        return max(self.align, size - size % self.align) if size >= self.align else size

    # -- internals ------------------------------------------------------------------------------

    def _key(self, tensors: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
        if callable(self.key):
            return self.key(*args, **kwargs)
        x = tensors[0]
        d = self.dim % x.ndim
        shape = tuple(None if i == d else s for i, s in enumerate(x.shape))
        base = (shape, str(x.dtype), str(x.device))
        return base if self.key is None else (self.key, base)

    def _remember(self, key: Hashable, ok: int | None = None, failed: int | None = None) -> None:
        with self._lock:
            m = self.memo.get(key, ChunkMemo())
            largest = max(m.largest_ok, ok) if ok is not None else m.largest_ok
            smallest = m.smallest_failed
            if failed is not None:
                smallest = failed if smallest is None else min(smallest, failed)
            self.memo[key] = ChunkMemo(largest, smallest)

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ChunkRun]:
        import torch

        if len(args) < self.inputs:
            raise TypeError(f"expected {self.inputs} tensor argument(s) to cut, got {len(args)}")
        tensors, rest = tuple(args[: self.inputs]), tuple(args[self.inputs :])
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"chunked inputs must be tensors, got {type(t).__name__}")
        length = tensors[0].shape[self.dim]
        for t in tensors[1:]:
            if t.shape[self.dim] != length:
                raise ValueError(f"all chunked inputs need the same length along dim {self.dim}: {length} vs {t.shape[self.dim]}")
        if length % self.align:
            raise ValueError(f"input length {length} along dim {self.dim} is not a multiple of align={self.align}")
        key = self._key(tensors, args, kwargs)
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__

        size = self.plan(key, length)
        start_size = size
        out = weight = None
        out_dim = None
        pos = 0
        pieces = calls = halvings = grows = streak = 0
        need = self.grow_after  # successes before trying a doubled piece; doubles when that fails
        grown = False  # the current size came from a grow-back (not yet proven)
        released = 0

        while pos < length:
            core = min(size, length - pos)
            a, b = self._window(pos, core, length)
            calls += 1
            try:
                y = fn(*(t.narrow(self.dim, a, b - a) for t in tensors), *rest, **kwargs)
            except Exception as exc:
                if not is_oom(exc):
                    raise
                half = (core // 2) - (core // 2) % self.align
                if half < self.min_chunk:
                    stats.add(ooms=1, give_ups=1)
                    self._remember(key, failed=core)
                    log.error(
                        "OOM (%s) in %s on a piece of %d (minimum %d): giving up", oom_kind(exc), name, core, self.min_chunk
                    )
                    raise
                strip_traceback(exc)
                failed = exc
            else:
                if out is None:
                    out_dim, out, weight = self._allocate(torch, y, b - a, length)
                self._place(y, out, weight, out_dim, pos, core, a, b, length)
                del y
                pieces += 1
                self._remember(key, ok=core)
                pos += core
                streak += 1
                if core == size:
                    grown = False
                if streak >= need and size < length and pos < length:
                    size = min(length, size * 2)
                    streak = 0
                    grows += 1
                    grown = True
                continue
            # Out of the except block: the failed piece's frames are cleared; free and halve.
            freed = int(self._cleanup() or 0) if self._cleanup is not None else 0
            released += freed
            self._remember(key, failed=core)
            stats.add(ooms=1, halvings=1)
            log.warning(
                "OOM (%s) in %s on a piece of %d at %d/%d: released %s, halving to %d",
                oom_kind(failed),
                name,
                core,
                pos,
                length,
                format_size(freed),
                half,
            )
            del failed
            if grown:  # the grown-back size failed again: wait twice as long before the next try
                need *= 2
                grown = False
            size = half
            streak = 0
            halvings += 1

        if out is None:  # empty input: one call, nothing to cut
            out = fn(*tensors, *rest, **kwargs)
            calls += 1
        elif self.blend == "crossfade":
            out = out.div_(weight)
        report = ChunkRun(str(key), length, start_size, size, pieces, calls, halvings, grows, released)
        return out, report

    def _window(self, pos: int, core: int, length: int) -> tuple[int, int]:
        """Input positions [a, b) computed for the piece whose kept part starts at `pos`."""
        if self.blend == "trim":
            return max(0, pos - self.overlap), min(length, pos + core + self.overlap)
        return pos, min(length, pos + core + self.overlap)

    def _out_len(self, n: int) -> int:
        v = n * self.ratio
        if v.denominator != 1:
            raise ValueError(f"{n} input positions times ratio {self.ratio} is not whole; set align")
        return int(v)

    def _allocate(self, torch: Any, y: Any, window: int, length: int) -> tuple[int, Any, Any]:
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"chunked functions must return a tensor, got {type(y).__name__}")
        out_dim = (self.dim if self.out_dim is None else self.out_dim) % y.ndim
        if y.shape[out_dim] != self._out_len(window):
            raise ValueError(
                f"the function returned {y.shape[out_dim]} positions along dim {out_dim} for a window of {window}; "
                f"expected {self._out_len(window)} (window x ratio {self.ratio}): set ratio= / out_dim="
            )
        shape = list(y.shape)
        shape[out_dim] = self._out_len(length)
        device = y.device if self.out_device is None else torch.device(self.out_device)
        if self.blend == "trim":
            return out_dim, torch.empty(shape, dtype=y.dtype, device=device), None
        out = torch.zeros(shape, dtype=y.dtype, device=device)
        weight = None
        if self.blend == "crossfade":
            wshape = [1] * len(shape)
            wshape[out_dim] = shape[out_dim]
            weight = torch.zeros(wshape, dtype=y.dtype, device=device)
        return out_dim, out, weight

    def _ramp(self, torch: Any, n: int, like: Any) -> Any:
        return (torch.arange(n, dtype=like.dtype, device=like.device) + 0.5) / n

    def _place(self, y: Any, out: Any, weight: Any, out_dim: int, pos: int, core: int, a: int, b: int, length: int) -> None:
        import torch

        if y.shape[out_dim] != self._out_len(b - a):
            raise ValueError(
                f"the function returned {y.shape[out_dim]} positions along dim {out_dim} "
                f"for a window of {b - a}; expected {self._out_len(b - a)}"
            )
        y = y.to(out.device, non_blocking=False)
        if self.blend == "trim":
            src = y.narrow(out_dim, self._out_len(pos - a), self._out_len(core))
            out.narrow(out_dim, self._out_len(pos), self._out_len(core)).copy_(src)
            return
        start, n = self._out_len(a), self._out_len(b - a)
        if self.blend == "add":
            out.narrow(out_dim, start, n).add_(y)
            return
        # crossfade: ramp up over the overlap shared with the previous piece, down over the next.
        ov = self._out_len(self.overlap)
        w = torch.ones(n, dtype=out.dtype, device=out.device)
        if a > 0:
            k = min(ov, n)
            w[:k] = self._ramp(torch, ov, w)[:k]
        if b < length:
            k = min(ov, n)
            w[n - k :] = torch.minimum(w[n - k :], self._ramp(torch, ov, w).flip(0)[ov - k :])
        wshape = [1] * out.ndim
        wshape[out_dim] = n
        w = w.view(wshape)
        out.narrow(out_dim, start, n).add_(y * w)
        weight.narrow(out_dim, start, n).add_(w)


def chunked(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Decorator: `@chunked` or `@chunked(dim=-1, overlap=..., min_chunk=...)` (see `Chunker`)."""
    if fn is not None:
        if not callable(fn):
            raise TypeError("chunked takes a function, or keyword arguments only: @chunked(dim=-1)")
        return Chunker(fn, **options)
    Chunker(None, **options)  # reject bad options where they are written

    def decorate(f: Callable[..., Any]) -> Chunker:
        return Chunker(f, **options)

    return decorate
