"""Activation checkpointing switched on by the agent (`alloctune run --checkpointing`).

What the one confirming run of the checkpointing remedy needs: the user's program with
checkpointing on, its code unchanged. The first time a module is called in training mode with
autograd on, the outermost such module gets checkpointing the way its library offers it:
* a transformers model: `gradient_checkpointing_enable()` (its own layers, its own rules);
* a timm model: `set_grad_checkpointing(True)`;
* any other module: every repeated block -- a child of a `ModuleList` / `Sequential` whose class
  appears there at least twice and has children of its own -- runs through
  `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`.
Its submodules are then left alone (one model is switched once). What was switched is listed in
the agent's report (`checkpointing`). Standard library only, like the rest of the agent (it is
loaded by file path in the user's interpreter): torch is the one the program imported.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable


def enable(module: Any, torch: Any) -> str | None:
    """Switch checkpointing on in `module` (module doc); a line saying how, or None when it has
    nothing to checkpoint."""
    name = type(module).__name__
    for method in ("activation_checkpointing_enable", "gradient_checkpointing_enable"):  # newer name first
        if callable(getattr(module, method, None)) and getattr(module, "supports_gradient_checkpointing", False):
            getattr(module, method)()
            return f"{name}.{method}() (transformers)"
    if callable(getattr(module, "set_grad_checkpointing", None)):
        module.set_grad_checkpointing(True)
        return f"{name}.set_grad_checkpointing(True) (timm)"
    containers = (torch.nn.ModuleList, torch.nn.Sequential)
    wrapped: list[str] = []
    done: set[int] = set()
    for sub in module.modules():
        if id(sub) in done or not isinstance(sub, containers):
            continue
        kids = list(sub.children())
        repeated = {cls for cls, n in Counter(type(k) for k in kids).items() if n >= 2}
        for kid in kids:
            if type(kid) in repeated and any(True for _ in kid.children()):
                kid.forward = _checkpointed(kid.forward, torch)
                done.update(id(m) for m in kid.modules())
                wrapped.append(type(kid).__name__)
    if not wrapped:
        return None
    counts = Counter(wrapped)
    return f"{name}: torch.utils.checkpoint around " + ", ".join(f"{n} x {c}" for c, n in counts.items())


def _checkpointed(forward: Callable[..., Any], torch: Any) -> Callable[..., Any]:
    checkpoint = torch.utils.checkpoint.checkpoint

    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def install(torch: Any, enabled: list[str], note: Callable[[str], None]) -> Any:
    """A global forward pre-hook that switches the first model called in training on (module doc);
    its handle (`.remove()`)."""
    seen: set[int] = set()

    def pre_hook(module: Any, args: Any) -> None:
        key = id(module)
        if key in seen or not getattr(module, "training", False) or not torch.is_grad_enabled():
            return
        seen.update(id(m) for m in module.modules())
        try:
            what = enable(module, torch)
        except Exception as exc:  # noqa: BLE001 - the program runs on without the switch, and says so
            note(f"cannot switch checkpointing on in {type(module).__name__}: {exc}")
            return
        if what:
            enabled.append(what)

    return torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
