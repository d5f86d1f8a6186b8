"""Synthetic programs for the explain tests, written as torch memory snapshots with Python stacks.

Each program is a list of steps (allocate with a stack / free); the simulated allocator (run
forward here, as the GPU would) places the blocks and makes the segment events, and the
result is a `_dump_snapshot`-shaped dict with `frames` on every `alloc` event. The *facts*
(parameter bytes, optimizer state bytes, bytes a kept list holds, per step) are known by
construction, so the tests compare explain's numbers with them, not with its own output.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alloctune.sim.replay import make_allocator
from alloctune.sim.settings import SimSettings

SITE = "/home/user/.venv/lib/python3.11/site-packages/"
USER = "/home/user/project/train.py"


def fr(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


CONSTRUCT = [fr(SITE + "torch/nn/modules/module.py", 1340, "convert"), fr(SITE + "torch/nn/modules/module.py", 942, "_apply"),
             fr(SITE + "torch/nn/modules/module.py", 1355, "to"), fr(USER, 12, "main")]
INPUT = [fr(USER, 20, "main")]
LINEAR = [fr(SITE + "torch/nn/modules/linear.py", 125, "forward"), fr(SITE + "torch/nn/modules/module.py", 1750, "_call_impl"),
          fr(USER, 22, "main")]
ADAMW = [fr(SITE + "torch/optim/adamw.py", 180, "_init_group"), fr(SITE + "torch/optim/optimizer.py", 480, "wrapper"),
         fr(USER, 26, "main")]
ADAMW_TMP = [fr(SITE + "torch/optim/adamw.py", 420, "_multi_tensor_adamw"), fr(USER, 26, "main")]
LOSS = [fr(SITE + "torch/nn/functional.py", 3100, "cross_entropy"), fr(USER, 23, "main")]
BACKWARD: list[dict[str, Any]] = []  # autograd's engine thread: no Python frames


@dataclass
class Facts:
    param_bytes: int = 0
    optimizer_bytes: int = 0
    kept_per_step: int = 0
    kept_at_end: int = 0
    kept_after_step: list[int] = field(default_factory=list)  # bytes the list holds once each step appended
    steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Recorder:
    """Runs allocations through the simulated allocator and writes torch-format events."""

    def __init__(self, settings: SimSettings | None = None) -> None:
        self.alloc = make_allocator(settings or SimSettings())
        self.events: list[dict[str, Any]] = []
        self.t = 1_000_000
        self.blocks: dict[int, Any] = {}
        self.next_id = 0

    def _flush(self) -> None:
        assert self.alloc.events is not None
        for e in self.alloc.events:
            self._ev(e.action, e.addr, e.size, [])
        self.alloc.events.clear()

    def _ev(self, action: str, addr: int, size: int, frames: list) -> None:
        self.t += 3
        self.events.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": self.t,
                            "frames": frames})

    def malloc(self, size: int, frames: list) -> int:
        b = self.alloc.malloc(size, 0)
        assert b is not None
        self._flush()
        self._ev("alloc", b.addr, size, frames)
        h = self.next_id
        self.next_id += 1
        self.blocks[h] = (b, size)
        return h

    def free(self, h: int) -> None:
        b, size = self.blocks.pop(h)
        addr = b.addr  # (the block object merges with its free neighbours when freed)
        self._ev("free_requested", addr, size, [])
        self.alloc.free(b)
        self._ev("free_completed", addr, size, [])
        self._flush()

    def snapshot(self) -> dict[str, Any]:
        return {"segments": [], "device_traces": [self.events], "allocator_settings": {}}


MiB = 1 << 20


def training_loop(steps: int = 8, keep_logits: bool = True, stacks: bool = True,
                  params: tuple[int, ...] = (40 * MiB, 40 * MiB, 4 * MiB + 1000, 12345), batch: int = 6 * MiB + 512,
                  logits: int = 3 * MiB + 2048, vary: bool = False,
                  make_logits: bool = True) -> tuple[dict[str, Any], Facts]:
    """A training loop with AdamW (2 state tensors per parameter, made in the first step) whose
    `logits` are appended to a list every step when `keep_logits` (else freed at the step's end).
    `vary`: every step has its own batch size (activations and logits scale with it) and makes
    0-3 extra temporaries, as a loop over documents of uneven length does. `make_logits=False`:
    the program that never allocates the logits at all (what "without the growth" means)."""
    rec = Recorder()
    s = (lambda f: f) if stacks else (lambda f: [])
    facts = Facts(param_bytes=sum(params), steps=steps)
    p_handles = [rec.malloc(p, s(CONSTRUCT)) for p in params]
    grads: list[int] = []
    state: list[int] = []
    kept: list[int] = []
    kept_bytes = 0
    for step in range(steps):
        scale = (1 + (step * 7) % 5) / 3 if vary else 1.0
        x = rec.malloc(int(batch * scale), s(INPUT))
        for g in grads:  # zero_grad(set_to_none=True)
            rec.free(g)
        grads = []
        h1 = rec.malloc(int(16 * MiB * scale), s(LINEAR))
        h2 = rec.malloc(int((24 * MiB + 4096) * scale), s(LINEAR))
        for _ in range((step * 5) % 4 if vary else 0):
            rec.free(rec.malloc(int(2 * MiB * scale), s(LINEAR)))
        out = rec.malloc(int(logits * scale), s(LINEAR)) if make_logits else None
        if keep_logits and out is not None:
            kept.append(out)  # right after the forward, as a metrics list does
            kept_bytes += int(logits * scale)
            facts.kept_after_step.append(kept_bytes)
        loss = rec.malloc(512, s(LOSS))
        # backward: parameter-sized gradients and activation gradients, no Python frames
        ga = rec.malloc(int((24 * MiB + 4096) * scale), BACKWARD)
        for p in reversed(params):
            grads.append(rec.malloc(p, BACKWARD))
        rec.free(ga)
        rec.free(h2)
        rec.free(h1)
        rec.free(loss)
        if step == 0:
            for p in params:
                state.append(rec.malloc(p, s(ADAMW)))
                state.append(rec.malloc(p, s(ADAMW)))
        tmp = rec.malloc(40 * MiB, s(ADAMW_TMP))
        rec.free(tmp)
        rec.free(x)
        if not keep_logits and out is not None:
            rec.free(out)
    facts.optimizer_bytes = 2 * sum(params)
    facts.kept_per_step = logits if keep_logits else 0
    facts.kept_at_end = kept_bytes
    facts.extra = {"handles": len(p_handles)}
    return rec.snapshot(), facts


def write(snapshot: dict[str, Any], path: Path) -> Path:
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    return path
