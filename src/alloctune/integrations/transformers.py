"""alloctune inside a Hugging Face `Trainer`: history while training, a diagnosis at the OOM.

    from alloctune.integrations.transformers import AlloctuneCallback, alloctune_oom_guard

    trainer = Trainer(model, args, train_dataset=data, callbacks=[AlloctuneCallback("oom/")])
    with alloctune_oom_guard(trainer):
        trainer.train()

`AlloctuneCallback` (a `transformers.TrainerCallback`) starts the allocator history at
`on_train_begin` when CUDA is available (bounded by `max_entries`, Python stacks) and stops it
at `on_train_end`.

How the OOM is seen: a `TrainerCallback` has no exception hook -- the `Trainer` calls its
callbacks only at named events, and an exception in the training loop skips all later events.
So the OOM is caught where it leaves `trainer.train()`: `alloctune_oom_guard(trainer)` is a
context manager around that call. It reports the OOM (snapshot with the run record, diagnosis,
one line on stderr) and re-raises the same exception, traceback intact -- training still fails.

Why a context manager and not a wrapped `trainer.training_step`: the step is only part of what
can run out of memory (the optimizer step, the evaluation loop and checkpoint saving run outside
it, and the optimizer's first step, which allocates its state, is a common place to OOM); a
wrapper would also replace a method on the user's object, which other libraries patch too.
The block sees every OOM `train()` raises and changes nothing inside the `Trainer`. With
`auto_find_batch_size=True` the `Trainer` catches its own OOMs while it searches, so the guard
sees only one that ends the search.

The guard uses the trainer's `AlloctuneCallback` if it has one, else adds one (built from the
guard's arguments). A history that also holds the model's own allocations needs recording
before the model reaches the GPU: call `callback.start()` before building the `Trainer`.

transformers is imported only when `AlloctuneCallback` is first used, so this module imports
without it (and without torch).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from alloctune.errors import InputError
from alloctune.integrations.backend import CudaBackend
from alloctune.integrations.optional import callback_class
from alloctune.integrations.recorder import DEFAULT_MAX_ENTRIES, OOMRecorder, oom_guard

__all__ = ["AlloctuneCallback", "TrainerHooks", "alloctune_oom_guard"]

INSTALL = "'alloctune[workloads]' (or: pip install transformers)"


class TrainerHooks:
    """The callback's behaviour, apart from its `TrainerCallback` base (which needs transformers).

    Arguments: `out_dir` for the OOM snapshots; `max_entries` allocator events kept (the
    lead-up to the OOM, not the whole run); `stacks` "python" or "all" (C++ frames too, slower);
    `backend`, `stream`, `command` as for `OOMRecorder`.
    """

    def __init__(
        self,
        out_dir: str | Path = ".",
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        stacks: str = "python",
        backend: CudaBackend | None = None,
        stream: TextIO | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        self.recorder = OOMRecorder(
            out_dir, max_entries=max_entries, stacks=stacks, backend=backend, stream=stream, command=command
        )

    def start(self) -> bool:
        """Record from now on (True when CUDA is there to record); `on_train_begin` calls it."""
        return self.recorder.start()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.recorder.start()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.recorder.stop()


@functools.cache
def _callback_class() -> type:
    """`AlloctuneCallback`: `TrainerHooks` on `transformers.TrainerCallback`, built once."""
    return callback_class(TrainerHooks, ("transformers",), "TrainerCallback", INSTALL, globals())


if TYPE_CHECKING:  # what type checkers see; at run time `__getattr__` builds it on first use

    class AlloctuneCallback(TrainerHooks): ...


def __getattr__(name: str) -> Any:
    if name == "AlloctuneCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _callbacks_of(trainer: Any) -> list[Any]:
    handler = getattr(trainer, "callback_handler", None)
    callbacks = getattr(handler, "callbacks", None)
    if not isinstance(callbacks, list) or not callable(getattr(trainer, "add_callback", None)):
        raise InputError(f"alloctune_oom_guard needs a transformers Trainer, got {type(trainer).__name__}")
    return callbacks


@contextmanager
def alloctune_oom_guard(trainer: Any, out_dir: str | Path | None = None, **options: Any) -> Iterator[OOMRecorder]:
    """Around `trainer.train()`: report an OOM it raises (snapshot, diagnosis, one line), then re-raise it.

    Uses the trainer's `AlloctuneCallback`; without one, adds `AlloctuneCallback(out_dir, **options)`.
    Options given to both the guard and an existing callback would disagree: that is an `InputError`.
    """
    hooks = [cb for cb in _callbacks_of(trainer) if isinstance(cb, TrainerHooks)]
    if hooks and (out_dir is not None or options):
        raise InputError(
            "the trainer already has an AlloctuneCallback; give out_dir and options to it, not to alloctune_oom_guard"
        )
    if not hooks:
        callback = _callback_class()("." if out_dir is None else out_dir, **options)
        trainer.add_callback(callback)
        hooks = [callback]
    with oom_guard(hooks[0].recorder) as recorder:
        yield recorder
