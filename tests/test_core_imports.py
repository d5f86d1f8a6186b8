"""The layering rules (#20): the core imports without torch, matplotlib or ray, and never the CLI.

Core = every module of the package except the GPU edge and the CLI listed in `EDGE`, so a new
module is checked without anyone remembering to add it here.
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import alloctune

# `runner` here is the shim at the old path (issue 26); `run/` itself imports without torch, so it is checked.
EDGE = {"agent", "runner", "guard", "monitor", "workloads", "cli", "__main__"}
ROOT = Path(alloctune.__file__).parent


def core_modules() -> list[str]:
    """Every importable core module name (packages walked recursively)."""
    out = []
    for info in pkgutil.iter_modules([str(ROOT)]):
        if info.name in EDGE:
            continue
        name = f"alloctune.{info.name}"
        out.append(name)
        if info.ispkg:
            out += [m.name for m in pkgutil.walk_packages([str(ROOT / info.name)], prefix=name + ".")]
    return sorted(out)


_BLOCKED_IMPORT = r'''
import importlib, json, sys

BLOCKED = ("torch", "matplotlib", "ray")

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, Block())
failed = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED or m.startswith("alloctune.cli"))
print(json.dumps({"failed": failed, "leaked": leaked}))
'''


# Modules #20 names explicitly: if discovery ever missed them, the test would pass without checking them.
MUST_COVER = {
    "alloctune.units", "alloctune.sim.replay", "alloctune.sim.simulate", "alloctune.api", "alloctune.diagnose.service",
    "alloctune.sim.sweep", "alloctune.sim.addresses", "alloctune.sim.sizes", "alloctune.trace.fallible",
    "alloctune.tune.confirm", "alloctune.diagnose.what_if", "alloctune.config.effective",
}
# Packages and modules still landing on other branches: covered as soon as they exist here.
WHEN_PRESENT = ("plan", "run")


def _required() -> set[str]:
    names = set(MUST_COVER)
    names |= {f"alloctune.tune.executors.{p.stem}" for p in (ROOT / "tune" / "executors").glob("*.py")
              if p.stem != "__init__"}  # ray_tasks included: it imports ray only when a pool starts
    for name in WHEN_PRESENT:
        if (ROOT / name).is_dir() or (ROOT / f"{name}.py").is_file():
            names.add(f"alloctune.{name}")
            names |= {f"alloctune.{name}.{p.stem}" for p in (ROOT / name).glob("*.py") if p.stem != "__init__"}
    return names


def test_core_imports_with_torch_matplotlib_and_ray_blocked():
    names = core_modules()
    assert _required() - set(names) == set()
    assert len(_required() & {n for n in names if ".executors." in n}) >= 10
    proc = subprocess.run([sys.executable, "-c", _BLOCKED_IMPORT, json.dumps(names)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["failed"] == {}, result["failed"]
    assert result["leaked"] == [], "a core import pulled in torch/matplotlib/ray or the CLI"


def _imported_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_no_cli_module_is_imported_from_the_core():
    """Also lazily (inside functions): the core must work where the CLI is not wanted."""
    offenders = {}
    for path in ROOT.rglob("*.py"):
        top = path.relative_to(ROOT).parts[0].removesuffix(".py")
        if top in EDGE:
            continue
        bad = sorted(n for n in _imported_names(path) if n == "alloctune.cli" or n.startswith("alloctune.cli."))
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}
