"""Where the memory goes: `alloctune explain`.

At one moment of a recording (the peak of reserved memory, the OOM it ends in, or any event)
the reserved bytes split exactly into categories (model state, gradients, optimizer state,
activations, growing memory, and the allocator's overhead), and the live bytes into sites
(the user's line with the library frame beside it); repetitions found in the recording tell
memory that a program keeps from memory it reuses, and what-ifs simulate what freeing a
site's kept blocks would save. Pure Python over plain data: no torch.
"""

from __future__ import annotations

from typing import Any

from alloctune.explain.model import CATEGORIES, SCHEMA, Category, Comparison, Explanation, Site, WhatIfResult

__all__ = ["CATEGORIES", "SCHEMA", "Category", "Comparison", "Explanation", "Site", "WhatIfResult", "explain", "explain_against"]


def explain(*args: Any, **kwargs: Any) -> Explanation:
    """See `alloctune.explain.api.explain` (imported on the first call: `import alloctune.explain` stays cheap)."""
    from alloctune.explain.api import explain as _explain

    return _explain(*args, **kwargs)


def explain_against(*args: Any, **kwargs: Any) -> Comparison:
    """See `alloctune.explain.api.explain_against`."""
    from alloctune.explain.api import explain_against as _against

    return _against(*args, **kwargs)
