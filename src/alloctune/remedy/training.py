"""Training remedies, simulated by rewriting the recording: activation checkpointing, optimizer
state, and freeing what a growing site keeps (`leak_remedy`, through `release.free_at_repeat_end`).

Each is a `Remedy` like the release points: the request stream rewritten the way the change
would rewrite the program's requests, its min budget from `sim.sweep`.

* Activation checkpointing of the repeated blocks. The blocks are the repeated modules of the
  forward pass: N is the largest count such that the stacks recurring a multiple of N times per
  step make most of its allocations (a block's stack recurs once or more per block); a block's
  window runs from one occurrence of its first allocation's stack to the next. Of what a window
  allocates, those freed once backward has begun are what autograd saved for it, except the
  block's output (the next block's input, freed while the next block's backward runs); a
  residual the next block frees and autocast's cached casts (freed when the forward's autocast
  region ends) keep their own frees. With checkpointing the saved blocks are freed where the
  window ends, or where the allocation after them is made when that comes first (a tensor only
  autograd kept dies with its last use, taken as the next op), while the block's input -- when
  the block before keeps none of it for backward, the last of what was made before the block
  that the block's forward lets go of -- is held by the checkpoint until the block's backward
  is done. The window's allocations are made again (its own frees with them) when the block's
  backward starts: right after the backward of the block after it has freed what it saved (the
  last block: before it frees its first saved block). What the recomputation makes beyond the
  saved blocks is dropped at once; the recomputed saved blocks are freed where the originals
  were. A block begins where a run of the forward's first block-repeated stack begins (the
  first block may make first-time allocations, a cuBLAS workspace, that the others do not).
* Optimizer state. The state is what the optimizer's frames made and held past their step,
  one stack per kind of state (Adam's `exp_avg`, `exp_avg_sq`). SGD with momentum keeps one
  buffer per parameter and makes no temporaries in its step (no weight decay): the largest state
  kind is kept, the others and the step's temporaries are dropped. 8-bit AdamW (bitsandbytes)
  keeps each state of a tensor of at least 4096 elements as one byte per element plus a float
  per 256-element block (absmax); smaller tensors keep 32-bit state. Elements are counted as
  fp32 (4 bytes), the dtype of an fp32 model's state.
"""

from __future__ import annotations

import bisect
from collections import Counter
from itertools import compress
from typing import NamedTuple, Sequence

from alloctune.analysis.core import Analysis, Lifetimes
from alloctune.analysis.phases import BACKWARD, FORWARD, OPTIMIZER_STEP, trains
from alloctune.remedy.model import BaseActivity, Remedy, Row, Shared, activity, recorded_conf, simulated, spliced
from alloctune.remedy.release import free_at_repeat_end, freed_key
from alloctune.trace.model import ALLOC, FREE, Trace

BNB_MIN_8BIT = 4096  # bitsandbytes keeps 32-bit state below this many elements
BNB_BLOCK = 256  # elements per absmax float in blockwise 8-bit state


class Window(NamedTuple):
    """One block's forward: requests [start, end); `saved` are its allocations (ids) that outlive it
    except its `outputs` (the next block's input, kept by it for backward); `inputs`: made before
    it and freed in its forward, what the checkpoint holds when the block before keeps nothing.
    (A training recording has one per block and step: a hundred thousand in a long run.)"""

    start: int
    end: int
    allocs: tuple[int, ...]
    saved: tuple[int, ...]
    outputs: tuple[int, ...]
    inputs: tuple[int, ...] = ()


def block_windows(an: Analysis) -> list[Window]:
    """Every repeated block's forward window in the recording (module doc)."""
    life, rep, phases = an.life, an.repeats, an.phase_of or []
    if not phases or an.stacks != "python":
        return []
    rep_starts, alloc, stack, flags = rep.starts, life.alloc, life.stack, an.flags
    by_rep: dict[int, list[int]] = {}
    for k, sid in enumerate(stack):
        if sid >= 0 and phases[k] == FORWARD and flags[sid].model >= 0:
            by_rep.setdefault(bisect.bisect_right(rep_starts, alloc[k]) - 1, []).append(k)
    out: list[Window] = []
    # Where the blocks of a forward lie depends only on its sequence of stacks, which a training
    # loop repeats step after step: worked out once per sequence
    shapes: dict[tuple[int, ...], tuple[int, list[int]] | None] = {}
    for ks in by_rep.values():
        sig = tuple([stack[k] for k in ks])
        if sig not in shapes:
            shapes[sig] = _shape(sig)
        shape = shapes[sig]
        if shape is not None:
            out += _forward_windows(an, ks, [ks[p] for p in shape[1]], ks[shape[0]])
    return out


def _shape(stacks: tuple[int, ...]) -> tuple[int, list[int]] | None:
    """Of one forward's allocations (their stacks, in order): the position of its blocks' last allocation
    and where each block begins (`_block_starts`, else `_uniform_starts`); None when no block repeats."""
    count = Counter(stacks)
    n = _repeats_per_step(count, len(stacks))
    if n is None:
        return None
    layer = [p for p, sid in enumerate(stacks) if count[sid] % n == 0]
    return layer[-1], _block_starts(stacks, count, n) or _uniform_starts(stacks, layer, count, n)


def _forward_windows(an: Analysis, ks: list[int], starts: list[int], last: int) -> list[Window]:
    """The windows of one forward whose block allocations are `ks`, the blocks beginning at `starts`
    and the last block allocation `last` (allocation ids)."""
    life = an.life
    alloc, free, never = life.alloc, life.free, life.n
    forward_end = alloc[last] + 1
    backward_start = _backward_start(an, last)
    spans = []
    for i, k0 in enumerate(starts):
        k1 = starts[i + 1] if i + 1 < len(starts) else last + 1
        b = alloc[k1] if k1 < len(alloc) and i + 1 < len(starts) else forward_end
        # what backward frees of the block's allocations: saved tensors, and its output -- not a residual
        # the next block frees, nor autocast's cached casts (freed when the forward's autocast region
        # ends), nor anything kept for good
        held = [k for k in range(k0, k1) if free[k] >= b and backward_start <= free[k] < never]
        spans.append((k0, k1, b, held))
    out: list[Window] = []
    outputs = _outputs(life, spans)
    for i, ((k0, k1, b, held), outs) in enumerate(zip(spans, outputs)):
        ins: tuple[int, ...] = ()
        if i == 0 or not outputs[i - 1]:
            # the block's input when no block of it is kept by the next: the last of what was made before
            # it (since the block before began) that the block's forward lets go of
            since = spans[i - 1][0] if i else ks[0]
            lo, hi = alloc[k0], b
            freed_here = [k for k in range(since, k0) if lo <= free[k] < hi]
            ins = (max(freed_here, key=free.__getitem__),) if freed_here else ()
        out.append(Window(alloc[k0], b, tuple(range(k0, k1)), tuple(k for k in held if k not in outs), tuple(sorted(outs)), ins))
    return out


def _block_starts(stacks: tuple[int, ...], count: Counter, n: int) -> list[int] | None:
    """Where each of the n blocks of one forward begins (positions in its allocations `stacks`): the first
    allocation of the first stack that recurs at least n times opens a block wherever a run of that stack
    begins (a block's first call may make first-time allocations the others do not: a cuBLAS workspace).
    None unless there are n."""
    anchor = next((sid for sid in stacks if count[sid] >= n), None)
    starts = [p for p, sid in enumerate(stacks) if sid == anchor and (p == 0 or stacks[p - 1] != anchor)]
    return starts if len(starts) == n else None


def _uniform_starts(stacks: tuple[int, ...], layer: list[int], count: Counter, n: int) -> list[int]:
    """Block starts when every block allocates alike: every m-th allocation of the first stack that
    recurs a multiple of n times (m times a block); `layer`: the positions of the block allocations."""
    anchor = stacks[layer[0]]
    return [p for p in layer if stacks[p] == anchor][:: count[anchor] // n]


def _outputs(life: Lifetimes, spans: list[tuple[int, int, int, list[int]]]) -> list[set[int]]:
    """The outputs of the blocks of one forward, told from their saved tensors. Backward runs the
    blocks last to first, so a block's output -- saved by the block after it -- is freed while that
    block's backward runs, before the block's own saved tensors: the blocks freed no later than the
    next block's last free. The last block's output sits where the others' do (the blocks are one
    code, allocating in one order)."""
    free = life.free
    ends = [max((free[k] for k in held), default=-1) for _, _, _, held in spans]
    offsets: set[int] = set()
    outputs: list[set[int]] = []
    for i, (k0, _, _, held) in enumerate(spans):
        if i + 1 < len(spans):
            outs = {k for k in held if free[k] <= ends[i + 1]}
            offsets = {k - k0 for k in outs}
        else:
            outs = {k0 + off for off in offsets} & set(held)
        outputs.append(outs)
    return outputs


def _backward_start(an: Analysis, last_forward: int) -> int:
    """The request where the backward after a forward begins: its first allocation made in backward
    (autograd's first gradient) after the forward's last block allocation `last_forward`."""
    phases, life = an.phase_of or [], an.life
    for k in range(last_forward + 1, len(life.alloc)):
        if phases[k] == BACKWARD:
            return life.alloc[k]
        if phases[k] == FORWARD and life.stack[k] == life.stack[last_forward]:
            break  # the next forward began: this one had no backward
    return life.alloc[last_forward] + 1


COVERAGE = 0.75  # share of a step's forward allocations the repeated blocks must make


def _repeats_per_step(count: Counter, allocations: int) -> int | None:
    """How many times the block repeats in one forward: the largest N >= 2 such that the stacks recurring
    a multiple of N times make at least `COVERAGE` of the forward's allocations (a block's stack recurs
    N, 2N, 3N... times: once or more per block); None when no N does."""
    for n in sorted({c for c in count.values() if c >= 2}, reverse=True):
        if sum(c for c in count.values() if c % n == 0) >= COVERAGE * allocations:
            return n
    return None


def with_checkpointing(an: Analysis, windows: Sequence[Window]) -> Trace:
    """The recording rewritten as if every window's block were checkpointed (module doc)."""
    trace, life = an.trace, an.life
    req = trace.requests
    n = len(req)
    rid_of = [req.rids[a] for a in life.alloc]
    next_rid = max(req.rids, default=-1) + 1
    free_at: dict[int, list[int]] = {}  # request index -> saved allocations freed before it
    dropped: set[int] = set()  # rids whose original FREE goes
    redo_at: dict[int, list[Window]] = {}  # request index -> windows recomputed before it
    ordered = sorted(windows, key=lambda w: w.start)
    alloc, free = life.alloc, life.free
    last_free = [max([free[k] for k in w.saved], default=-1) for w in ordered]  # of each window's saved blocks
    for i, w in enumerate(ordered):
        for k in w.saved:  # what only autograd kept dies with its last use: taken as the op after it
            free_at.setdefault(min(w.end, alloc[k + 1] + 1), []).append(k)
            dropped.add(rid_of[k])
        if not w.saved:
            continue
        for k in w.inputs:  # the checkpoint holds the block's input until the block's backward is done
            free_at.setdefault(last_free[i] + 1, []).append(k)
            dropped.add(rid_of[k])
        at = min([free[k] for k in w.saved])
        if i + 1 < len(ordered) and ordered[i + 1].start >= w.end and ordered[i + 1].saved:
            at = min(at, last_free[i + 1] + 1)  # right after the next block's backward
        redo_at.setdefault(max(at, w.end), []).append(w)
    # original free request index of a saved block -> (request index from which on it holds, its clone's rid)
    clone_free: dict[int, list[tuple[int, int]]] = {}
    before: dict[int, list[Row]] = {}
    size, streams, evi = life.size, req.streams, req.event_index
    redo = _Redo(an, rid_of)
    for r in sorted(free_at.keys() | redo_at.keys()):
        if r >= n:
            break
        stream, ev = streams[r], evi[r]
        ks = free_at.get(r)
        rows = before[r] = [(FREE, size[k], rid_of[k], stream, ev, -1) for k in ks] if ks else []
        for w in redo_at.get(r, ()):
            clones = {k: next_rid + j for j, k in enumerate(w.allocs)}
            next_rid += len(w.allocs)
            rows += redo.rows(w, stream, ev, clones)
            for k in w.saved:
                clone_free.setdefault(free[k], []).append((r, clones[k]))
    changed: dict[int, Row | None] = {}
    ops, rids = req.ops, req.rids
    for r in compress(range(n), map(dropped.__contains__, rids)):
        if ops[r] != FREE:
            continue
        clone = [c for since, c in clone_free.get(r, ()) if since <= r]
        k = _alloc_of(rid_of, rids[r])
        changed[r] = (FREE, size[k], clone[-1], streams[r], evi[r], -1) if clone else None
    return spliced(trace, before, changed, given_stacks=True)


class _Redo:
    """The requests of a window's forward made again (`rows`), with what every window reads bound once."""

    def __init__(self, an: Analysis, rid_of: list[int]) -> None:
        life, req = an.life, an.trace.requests
        self.alloc, self.size, self.free, self.rid_of = life.alloc, life.size, life.free, rid_of
        self.ops, self.rids, self.stack_ids = req.ops, req.rids, req.stack_ids

    def rows(self, w: Window, stream: int, evi: int, clones: dict[int, int]) -> list[Row]:
        """Window `w`'s forward made again (as `clones`, on `stream` with event index `evi`): its
        allocations and its own frees, then a free of what backward does not need."""
        size, free, ops, rids, stack_ids, rid_of = self.size, self.free, self.ops, self.rids, self.stack_ids, self.rid_of
        in_window = set(w.allocs)
        out: list[Row] = []
        freed: set[int] = set()
        made = bisect.bisect_left(self.alloc, w.start)  # allocation id of the next ALLOC (`alloc` lists every ALLOC)
        for q in range(w.start, w.end):
            op = ops[q]
            if op == ALLOC:
                k, made = made, made + 1
                if k in in_window:
                    out.append((ALLOC, size[k], clones[k], stream, evi, stack_ids[q] if stack_ids else -1))
            elif op == FREE:
                k = _alloc_of(rid_of, rids[q])
                if k in in_window and free[k] == q:
                    out.append((FREE, size[k], clones[k], stream, evi, -1))
                    freed.add(k)
        # what the recomputation made beyond what backward needs (its output, a residual the next block
        # freed in the forward) is dropped at once; the saved blocks live until their own frees
        keep = w.saved
        out += [(FREE, size[k], clones[k], stream, evi, -1) for k in w.allocs if k not in freed and k not in keep]
        return out


def _alloc_of(rid_of: list[int], rid: int) -> int:
    """The allocation id (index into the lifetimes) of a request id: rids count up in allocation order."""
    k = bisect.bisect_left(rid_of, rid)
    return k if k < len(rid_of) and rid_of[k] == rid else -1


def checkpointing_code(trace: Trace) -> str:
    """The line to write for the recording's model library (its frames say which)."""
    table = trace.requests.stack_table
    files = {f[0].replace("\\", "/") for f in table.frames} if table is not None else set()
    if any("/transformers/" in f for f in files):
        return "model.gradient_checkpointing_enable()  # transformers; before the training loop"
    if any("/timm/" in f for f in files):
        return "model.set_grad_checkpointing(True)  # timm; before the training loop"
    return (
        "x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)  # for each repeated block in the model's forward"
    )


def checkpointing_remedy(
    an: Analysis, base: int | None, conf: str, base_act: BaseActivity | None = None, shared: Shared | None = None
) -> Remedy | None:
    windows = block_windows(an)
    if not windows:
        return None
    t = with_checkpointing(an, windows)
    per_step = len(windows) // max(1, an.repeats.count)
    return simulated(
        "checkpointing",
        f"activation checkpointing of the {per_step} repeated blocks of each step",
        t,
        conf,
        an.trace,
        base,
        base_act or activity(an.trace, conf, an.trace),
        checkpointing_code(an.trace),
        notes=(
            f"{len(windows)} block forwards recomputed in backward; "
            f"{sum(len(w.saved) for w in windows)} saved tensors freed at their block's end",
        ),
        shared=shared,
    )


# ---- optimizer state ----


def optimizer_blocks(an: Analysis) -> tuple[dict[int, list[int]], list[int], str | None]:
    """The optimizer's state by stack (stack id -> allocation ids, made in the first step that made
    any), its step temporaries (allocation ids), and the optimizer's file (`adamw.py`, ...)."""
    life, phases = an.life, an.phase_of or []
    last_alloc = life.alloc[-1] if life.alloc else 0
    state: dict[int, list[int]] = {}
    temps: list[int] = []
    kind = None
    table = an.trace.requests.stack_table
    for k, sid in enumerate(life.stack):
        if sid < 0 or not an.flags[sid].optimizer or phases[k] != OPTIMIZER_STEP:
            continue
        if kind is None and table is not None:
            kind = next(
                (
                    table.frames[f][0].replace("\\", "/").rsplit("/", 1)[-1]
                    for f in table.stacks[sid]
                    if "torch/optim/" in table.frames[f][0].replace("\\", "/") and not table.frames[f][0].endswith("optimizer.py")
                ),
                None,
            )
        if life.free[k] > last_alloc:
            state.setdefault(sid, []).append(k)
        else:
            temps.append(k)
    return state, temps, kind


def _rewrite_sizes(an: Analysis, drop: set[int], resize: dict[int, list[int]]) -> Trace:
    """The recording with the allocations in `drop` gone (and their frees) and each allocation in
    `resize` made as the listed sizes instead (each a block of its own, freed together)."""
    trace, life = an.trace, an.life
    req = trace.requests
    n = len(req)
    rid_of = [req.rids[a] for a in life.alloc]
    next_rid = max(req.rids, default=-1) + 1
    extra: dict[int, list[int]] = {}  # rid of a resized allocation -> the rids of its other blocks
    dropped_rids = {rid_of[k] for k in drop}
    touched = dropped_rids | {rid_of[k] for k in resize}
    ops, rids, streams, evi = req.ops, req.rids, req.streams, req.event_index
    stack_ids = req.stack_ids
    changed: dict[int, Row | None] = {}
    after: dict[int, list[Row]] = {}  # rows put in just after a request (so before the next)
    for r in compress(range(n), map(touched.__contains__, rids)):
        op, rid = ops[r], rids[r]
        sid = stack_ids[r] if stack_ids else -1
        if op in (ALLOC, FREE) and rid in dropped_rids:
            changed[r] = None
            continue
        if op == ALLOC:
            k = _alloc_of(rid_of, rid)
            if k in resize:
                first, *rest = resize[k]
                changed[r] = (ALLOC, first, rid, streams[r], evi[r], sid)
                extra[rid] = list(range(next_rid, next_rid + len(rest)))
                next_rid += len(rest)
                after[r + 1] = [(ALLOC, size, other, streams[r], evi[r], sid) for other, size in zip(extra[rid], rest)]
                continue
        if op == FREE and rid in extra:
            k = _alloc_of(rid_of, rid)
            after[r + 1] = [(FREE, size, other, streams[r], evi[r], -1) for other, size in zip(extra[rid], resize[k][1:])]
    return spliced(trace, after, changed, given_stacks=True)


def optimizer_remedies(
    an: Analysis, base: int | None, conf: str, base_act: BaseActivity | None = None, shared: Shared | None = None
) -> list[Remedy]:
    state, temps, kind = optimizer_blocks(an)
    if kind not in ("adamw.py", "adam.py") or len(state) < 2:
        return []
    kinds = sorted(state, key=lambda sid: min(state[sid]))
    # SGD's one buffer per parameter stands for the largest kind (Adam's exp_avg; not a fused step's counters)
    keep = max(kinds, key=lambda sid: (sum(an.life.size[k] for k in state[sid]), -min(state[sid])))
    base_act = base_act or activity(an.trace, conf, an.trace)
    state_bytes = sum(an.life.size[k] for ks in state.values() for k in ks)
    out = []
    drop = {k for sid in kinds if sid != keep for k in state[sid]} | set(temps)
    out.append(
        simulated(
            "optimizer_sgd",
            "SGD with momentum instead of Adam: one state tensor per parameter, no step temporaries",
            _rewrite_sizes(an, drop, {}),
            conf,
            an.trace,
            base,
            base_act,
            "torch.optim.SGD(model.parameters(), lr=..., momentum=0.9)  # changes the training dynamics",
            notes=(f"Adam state {state_bytes} bytes in {len(kinds)} kinds; SGD keeps one kind",),
            shared=shared,
        )
    )
    resize: dict[int, list[int]] = {}
    for sid in kinds:
        for k in state[sid]:
            n = an.life.size[k] // 4
            if n >= BNB_MIN_8BIT:
                resize[k] = [n, -(-n // BNB_BLOCK) * 4]
    out.append(
        simulated(
            "optimizer_8bit",
            "8-bit AdamW (bitsandbytes): one byte per state element plus a float per 256",
            _rewrite_sizes(an, set(temps), resize),
            conf,
            an.trace,
            base,
            base_act,
            "bitsandbytes.optim.AdamW8bit(model.parameters(), lr=...)  # pip install bitsandbytes",
            notes=(
                "state sizes by bitsandbytes' blockwise rule (tensors of 4096+ elements); its fused step makes "
                "no temporaries; not confirmed on a GPU by alloctune",
            ),
            shared=shared,
        )
    )
    return out


def leak_remedy(
    an: Analysis, base: int | None, conf: str, base_act: BaseActivity | None = None, shared: Shared | None = None
) -> Remedy | None:
    """The growing sites' kept blocks freed at the end of the repetition that made them (the what-if
    `explain` shows per site: with `shared`, the very rewrite), as a remedy naming the lines that keep them."""
    growing = sorted((i for i, (g, _) in an.growth.items() if g), key=lambda i: -an.growth[i][1])
    if not growing:
        return None
    names = "; ".join(f"{an.labels[i]} (+{an.growth[i][1]} bytes a repetition)" for i in growing[:3])
    t = shared.rewrite(freed_key(growing), lambda: free_at_repeat_end(an, growing)) if shared else free_at_repeat_end(an, growing)
    return simulated(
        "free_growing",
        f"free what the growing site(s) keep each repetition: {names}",
        t,
        conf,
        an.trace,
        base,
        base_act or activity(an.trace, conf, an.trace),
        f"at {an.labels[growing[0]]}: keep a number (loss.item()) or move the tensor off the GPU (.detach().cpu()) "
        "instead of keeping it on the GPU across steps",
        notes=tuple(f"grows: {an.labels[i]}" for i in growing),
        shared=shared,
    )


def training_remedies(
    an: Analysis, base: int | None, conf: str | None = None, base_act: BaseActivity | None = None, shared: Shared | None = None
) -> list[Remedy]:
    """The leak, checkpointing and optimizer-state remedies of a training recording (none for inference);
    the recording's own uncapped replay, which each compares with, is made once for all of them (or
    handed in as `base_act`); `shared`: the work the recording's what-ifs and other remedies share."""
    if not trains(an.trace.requests):
        return []
    conf = recorded_conf(an.trace) if conf is None else conf
    base_act = base_act or activity(an.trace, conf, an.trace)
    out = [
        r
        for r in (leak_remedy(an, base, conf, base_act, shared), checkpointing_remedy(an, base, conf, base_act, shared))
        if r is not None
    ]
    return out + optimizer_remedies(an, base, conf, base_act, shared)
