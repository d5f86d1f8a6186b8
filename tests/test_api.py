"""`alloctune.api`: the core entry points the CLI calls, under names that cannot clash with subpackages."""

from __future__ import annotations

from types import ModuleType

import pytest

from alloctune import api
from alloctune.sim.simulate import Simulation

MSG = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacity of 6.00 GiB "
       "of which 0 bytes is free. Of the allocated memory 2.93 GiB is allocated by PyTorch, and 2.30 GiB is reserved by "
       "PyTorch but unallocated.")


def test_every_public_name_is_a_function_even_after_subpackages_are_imported():
    import alloctune.diagnose.snapshot  # noqa: F401 - rebinding `alloctune.diagnose` must not matter here
    import alloctune.tune.strategy  # noqa: F401

    for name in api.__all__:
        obj = getattr(api, name)
        assert callable(obj) and not isinstance(obj, ModuleType), name


def test_simulate_and_diagnose_are_the_cli_functions(traces_dir):
    sim = api.simulate(traces_dir / "rvc_ec0" / "default.pickle.xz", ["expandable_segments:True"])
    assert isinstance(sim, Simulation) and not sim.failed and sim.rows[0].completed
    assert api.diagnose(MSG).verdict == "fragmentation"
    assert [d.verdict for d in api.diagnose_all(MSG + "\n" + MSG)] == ["fragmentation"]
    assert api.check_setting("expandable_segments:True", platform="windows").warnings[0].code == "expandable-windows"


def test_missing_provider_fails_clearly(monkeypatch):
    monkeypatch.setitem(api.PROVIDERS, "record", ("alloctune.no_such_module", "record"))
    with pytest.raises(api.ApiUnavailable, match="alloctune.api.record is not available: module "
                                                 "alloctune.no_such_module is not in this build"):
        api.record(["python", "x.py"])
    monkeypatch.setitem(api.PROVIDERS, "tune", ("alloctune.units", "no_such_function"))
    with pytest.raises(api.ApiUnavailable, match="has no function no_such_function"):
        api.tune()


def test_provided_entry_point_is_called(monkeypatch):
    monkeypatch.setitem(api.PROVIDERS, "plan", ("alloctune.units", "format_size"))
    assert api.plan(2048) == "2.00 KiB"


def test_no_entry_point_returns_any():
    """Every public function of `alloctune.api` names what it returns (a typed record, not `Any`)."""
    import inspect

    from alloctune import api

    for name in api.__all__:
        obj = getattr(api, name)
        if not inspect.isfunction(obj):
            continue
        ret = inspect.signature(obj).return_annotation
        assert ret is not inspect.Signature.empty, name
        assert "Any" != str(ret).strip() and not str(ret).startswith("Any"), (name, ret)
