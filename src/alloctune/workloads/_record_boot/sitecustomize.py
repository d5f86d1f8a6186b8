"""Bootstrap for `alloctune record`: turn on allocator history in the recorded program.

`alloctune record` puts this directory first on the child's PYTHONPATH, so Python imports
this file at start-up as `sitecustomize`. When ``ALLOCTUNE_RECORD`` names a file it starts
``torch.cuda.memory._record_memory_history`` before the program allocates anything and
dumps the snapshot there at exit (normal exit, uncaught exception, or SIGTERM). The
variable is removed from the environment at once, so only the first Python process records
(a launcher's children do not overwrite its trace). A `sitecustomize` that this file
shadows is still run, first, so site set-up (and any allocator settings it makes) is kept.

Must stay small and import nothing from alloctune: it runs inside the user's interpreter.
"""

from __future__ import annotations

import os
import sys


def _chain_shadowed() -> None:
    """Run the next `sitecustomize` on sys.path, the one this file hides."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.realpath(__file__))
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_alloctune_shadowed_sitecustomize"] = module
    spec.loader.exec_module(module)


def _start_recording(path: str) -> None:
    import atexit
    import signal

    import torch

    if not torch.cuda.is_available():
        print("alloctune record: CUDA is not available in this process; nothing recorded", file=sys.stderr)
        return
    max_entries = int(os.environ.get("ALLOCTUNE_RECORD_MAX_ENTRIES", "5000000"))
    device = os.environ.get("ALLOCTUNE_RECORD_DEVICE")
    torch.cuda.memory._record_memory_history(
        max_entries=max_entries, context=None, stacks="python", device=int(device) if device else None
    )
    dumped = []

    def dump() -> None:
        if dumped:
            return
        dumped.append(True)
        try:
            torch.cuda.memory._dump_snapshot(path)
        except Exception as exc:  # the program's own outcome matters more than the trace
            print(f"alloctune record: could not write the trace: {exc}", file=sys.stderr)

    atexit.register(dump)

    def on_sigterm(signum, frame) -> None:
        dump()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    # Keep a handler the program installs itself; only replace the default (die silently).
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_sigterm)


def _main() -> None:
    try:
        _chain_shadowed()
    except Exception as exc:
        print(f"alloctune record: the shadowed sitecustomize failed: {exc!r}", file=sys.stderr)
    path = os.environ.pop("ALLOCTUNE_RECORD", None)
    if not path:
        return
    try:
        _start_recording(path)
    except Exception as exc:
        print(f"alloctune record: could not start recording: {exc!r}", file=sys.stderr)


_main()
