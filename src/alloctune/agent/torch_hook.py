"""The one-shot import hook that tells the agent when the program has imported `torch`.

Split from `bootstrap.py` (standard library only, loaded by file path in the child, like it):
the agent must never import torch itself, so it waits for the program to do so.
"""

from __future__ import annotations

import sys


class _TorchImportHook:
    """A meta-path finder that lets `torch` import normally, then calls `on_import(torch)`.

    It removes itself on first use, so the cost for every other import is one string
    comparison until torch is imported, and nothing afterwards.
    """

    def __init__(self, on_import):
        self._on_import = on_import

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ChainedLoader(spec.loader, self._on_import)
        return spec

    # Old-style finders API (not used by Python 3.4+, kept so `pkgutil` stays happy).
    def find_module(self, name, path=None):  # pragma: no cover
        return None


class _ChainedLoader:
    def __init__(self, loader, after):
        self._loader = loader
        self._after = after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._after(module)

    def __getattr__(self, name):  # e.g. get_resource_reader, is_package
        return getattr(self._loader, name)
