"""alloctune: measure, simulate and fix fragmentation in PyTorch's CUDA caching allocator.

The core (units, config, diagnose, trace, sim, tune, report) is pure Python over plain
data and never imports torch; only the agent, runner, guard, monitor and workloads do.
"""

from __future__ import annotations

__version__ = "0.1.0"

from alloctune.errors import AlloctuneError

__all__ = ["AlloctuneError", "__version__", "diagnose"]


def diagnose(text_or_exception):  # noqa: D401 - thin forwarding wrapper
    """Diagnose an OOM message, a log containing one, or a caught exception.

    Imported lazily so `import alloctune` stays cheap.
    """
    from alloctune.diagnose import diagnose as _diagnose

    return _diagnose(text_or_exception)
