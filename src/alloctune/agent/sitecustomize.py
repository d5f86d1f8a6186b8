"""alloctune's agent entry point: Python imports this at start-up when its folder is first on PYTHONPATH.

`alloctune run` / `tune` copy this file into a per-trial folder and put that folder first on
the child's PYTHONPATH (never the package folder itself, so no other module name leaks into
the user's namespace). It must stay harmless:

* it first chains to the `sitecustomize` that would have run without us (the next one on
  `sys.path`), so a site's own start-up code keeps working;
* with `ALLOCTUNE_AGENT` unset it does nothing else;
* otherwise it loads `bootstrap.py` by file path (the child may use an interpreter where
  alloctune is not installed) and calls `activate()`; torch is not imported here;
* any failure becomes one line on stderr, never a broken program.
"""

import os
import sys

_ALLOCTUNE_AGENT_SITE = True  # marker: chaining skips files that carry it (nested runs)


def _chain_next_sitecustomize():
    """Find the first other `sitecustomize` on sys.path and execute it as that module would run."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.realpath(__file__))
    for entry in list(sys.path):
        try:
            if os.path.realpath(entry or os.getcwd()) == here:
                continue
        except (OSError, ValueError):
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is None or spec.loader is None:
            continue
        origin = spec.origin or ""
        if origin.endswith(".py"):
            try:
                with open(origin, encoding="utf-8", errors="replace") as fh:
                    if "_ALLOCTUNE_AGENT_SITE" in fh.read():
                        continue  # another copy of this file (an alloctune run inside a run)
            except OSError:
                continue
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules.setdefault("_alloctune_chained_sitecustomize", module)
        return origin
    return None


def _activate_agent():
    value = os.environ.get("ALLOCTUNE_AGENT")
    if not value:
        return
    import importlib.util
    import json

    path = None
    if value.lstrip().startswith("{"):
        path = json.loads(value).get("bootstrap")
    if not path:
        path = os.path.join(os.path.dirname(os.path.realpath(__file__)), "bootstrap.py")
    if not os.path.isfile(path):
        from alloctune.agent import bootstrap  # installed alongside: use the package copy
    else:
        spec = importlib.util.spec_from_file_location("_alloctune_agent_bootstrap", path)
        bootstrap = importlib.util.module_from_spec(spec)
        sys.modules["_alloctune_agent_bootstrap"] = bootstrap
        spec.loader.exec_module(bootstrap)
    bootstrap.activate()


try:
    _chain_next_sitecustomize()
except Exception as _exc:  # the other sitecustomize failed: say so, as Python itself would
    sys.stderr.write(f"Error in sitecustomize (chained by alloctune): {type(_exc).__name__}: {_exc}\n")
try:
    _activate_agent()
except Exception as _exc:
    sys.stderr.write(f"alloctune agent: not active: {type(_exc).__name__}: {_exc}\n")
