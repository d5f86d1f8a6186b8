"""alloctune inside a Lightning `Trainer`: history while fitting, a diagnosis at the OOM.

    from alloctune.integrations.lightning import AlloctuneCallback

    trainer = lightning.pytorch.Trainer(callbacks=[AlloctuneCallback("oom/")])
    trainer.fit(model)

Lightning, unlike transformers, gives callbacks an exception hook: `on_exception` runs before
Lightning tears down and re-raises, so no guard is needed and the OOM still ends `fit`.
Recording starts in `setup` for the "fit" stage (Lightning calls it before the strategy moves
the model to the GPU, so the model's own allocations are in the history) and stops in
`teardown` or `on_exception`.

Lightning is imported (`lightning.pytorch`, else the older `pytorch_lightning`) only when
`AlloctuneCallback` is first used, so this module imports without it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from alloctune.guard.oom import is_oom
from alloctune.integrations.backend import CudaBackend
from alloctune.integrations.optional import callback_class
from alloctune.integrations.recorder import DEFAULT_MAX_ENTRIES, OOMRecorder

__all__ = ["AlloctuneCallback", "LightningHooks"]

INSTALL = "lightning"


class LightningHooks:
    """The callback's behaviour, apart from its `Callback` base (which needs Lightning).

    Arguments as for `alloctune.integrations.transformers.TrainerHooks`.
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

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self.recorder.start()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if is_oom(exception):  # Lightning re-raises `exception` after this hook
            self.recorder.report_oom(exception)
        self.recorder.stop()  # fit ends here either way

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.recorder.stop()


@functools.cache
def _callback_class() -> type:
    """`AlloctuneCallback`: `LightningHooks` on Lightning's `Callback`, built once."""
    return callback_class(LightningHooks, ("lightning.pytorch", "pytorch_lightning"), "Callback", INSTALL, globals())


if TYPE_CHECKING:  # what type checkers see; at run time `__getattr__` builds it on first use

    class AlloctuneCallback(LightningHooks): ...


def __getattr__(name: str) -> Any:
    if name == "AlloctuneCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
