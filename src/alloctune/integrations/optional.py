"""Find a class of an optional framework (transformers, Lightning) only when a hook is asked for.

The hooks subclass the framework's callback class, so the class must exist before the hook
can; importing the framework when `alloctune.integrations` is imported would make every
alloctune import pay for it (and fail without it). Each hook module builds its class on
first access instead, through `callback_class`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from alloctune.errors import EnvironmentProblem

__all__ = ["callback_class", "framework_class"]


def framework_class(modules: Sequence[str], name: str, install: str) -> type:
    """`name` from the first of `modules` that imports; `EnvironmentProblem` naming `install` if none does."""
    tried: list[str] = []
    for module in modules:
        try:
            found = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            tried.append(f"{module} ({exc})")
            continue
        if isinstance(found, type):
            return found
        tried.append(f"{module} (its {name} is not a class)")
    raise EnvironmentProblem(
        f"{name} needs {' or '.join(modules)}, which cannot be imported: {'; '.join(tried)}; "
        f"install it with: pip install {install}"
    )


def callback_class(hooks: type, modules: Sequence[str], base_name: str, install: str, namespace: dict[str, object]) -> type:
    """`AlloctuneCallback`: `hooks` on the framework's `base_name` class, put into `namespace` (the hook
    module's globals) so later lookups, and pickle, find it as a plain attribute."""
    base = framework_class(modules, base_name, install)
    cls = type("AlloctuneCallback", (hooks, base), {"__doc__": hooks.__doc__, "__module__": namespace["__name__"]})
    namespace["AlloctuneCallback"] = cls
    return cls
