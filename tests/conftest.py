"""Shared fixtures: where the read-only ground truth lives, and the `gpu` marker's skip."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
TRACES = SHARED / "traces"
OOM_CORPUS = SHARED / "oom-messages" / "corpus.jsonl"


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"shared traces not found at {TRACES}")
    return TRACES


@pytest.fixture(scope="session")
def oom_corpus() -> Path:
    if not OOM_CORPUS.is_file():
        pytest.skip(f"OOM corpus not found at {OOM_CORPUS}")
    return OOM_CORPUS


@pytest.fixture
def fresh_guard_stats():
    """alloctune.guard's counters are process-wide: start and leave each guard test at zero."""
    from alloctune.guard import stats

    stats.reset()
    yield stats
    stats.reset()
