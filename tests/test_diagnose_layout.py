"""#20 (diagnose/report part): the allocator's rules in one place, plain-data types, no upward imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "alloctune"


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def _assigned(path: Path) -> set[str]:
    return {t.id for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


@pytest.mark.parametrize("path", sorted([*(PKG / "diagnose").glob("*.py"), *(PKG / "memory_map").glob("*.py")]),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_diagnose_declares_no_allocator_constant_and_imports_no_tune(path):
    assert not _assigned(path) & {"_MIN_BLOCK", "_SMALL_SIZE", "_SMALL_BUFFER", "_LARGE_BUFFER", "MIN_BLOCK",
                                  "SMALL_SIZE", "SMALL_BUFFER", "LARGE_BUFFER"}
    imports = _imports(path)
    assert not any(m == "alloctune.tune" or m.startswith("alloctune.tune.") for m in imports)
    assert "alloctune.sim.replay.make_allocator" not in imports  # no whole allocator to round a size
    assert len(path.read_text().splitlines()) <= 600


def test_memory_map_reads_events_through_the_trace_loader():
    src = (PKG / "memory_map" / "build.py").read_text()
    assert "alloctune.trace.stream.build_stream" in _imports(PKG / "memory_map" / "build.py")
    assert '"free_completed"' not in src and '"alloc"' not in src  # no second reading of raw actions
    assert "alloctune.sim.sizes" in _imports(PKG / "memory_map" / "build.py")


@pytest.mark.parametrize("path", sorted((PKG / "report").glob("*.py")), ids=lambda p: p.name)
def test_report_takes_plain_types_not_the_diagnosis_module(path):
    # report may *run* a diagnosis (diagnose_snapshot); its types come from the model module
    names = {m for m in _imports(path) if m.startswith("alloctune.diagnose.snapshot.")}
    assert names <= {"alloctune.diagnose.snapshot.diagnose_snapshot"}


def test_snapshot_model_is_plain_data():
    map_model = _imports(PKG / "memory_map" / "model.py")
    assert all(not m.startswith("alloctune") for m in map_model)  # nothing but the standard library
    imports = _imports(PKG / "diagnose" / "snapshot_model.py")
    assert all(not m.startswith("alloctune") or m.startswith("alloctune.memory_map.model") for m in imports)
