"""`alloctune.config.shells`: which variables to set, and exact quoting for bash, PowerShell, cmd, Python."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from alloctune.errors import InputError
from alloctune.config.shells import (
    env_assignments,
    parse_torch_version,
    quote_bash,
    quote_cmd,
    quote_powershell,
    render,
    render_all,
)

LIST_CONF = "expandable_segments:True,roundup_power2_divisions:[256:1,>:8]"


def test_parse_torch_version():
    assert parse_torch_version("2.10.0+cu130") == (2, 10)
    assert parse_torch_version("2.9") == (2, 9)
    assert parse_torch_version((2, 11, 0)) == (2, 11)
    assert parse_torch_version("nightly") is None
    assert parse_torch_version(None) is None


def test_env_assignments_by_version():
    assert env_assignments("expandable_segments:True", "2.9.1") == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    both = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64", "PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}
    assert env_assignments("max_split_size_mb:64", "2.10.0") == both
    assert env_assignments(" max_split_size_mb:64 ", None) == both  # unknown version: both are safe
    assert list(env_assignments("a:1", "2.13")) == ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"]


def test_env_assignments_vendors_and_errors():
    assert env_assignments("expandable_segments:True", "2.4", vendor="hip") == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True",
    }
    assert env_assignments("max_split_size_mb:64", vendor="npu") == {"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:64"}
    with pytest.raises(InputError):
        env_assignments("   ")
    with pytest.raises(InputError):
        env_assignments("a:1\nb:2")
    with pytest.raises(InputError):
        env_assignments("a:1", vendor="mps")


def test_render_exact_forms():
    a = env_assignments(LIST_CONF, "2.11")
    out = render_all(a)
    assert list(out) == ["bash", "powershell", "cmd", "python"]
    assert out["bash"] == (
        "export PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True,roundup_power2_divisions:[256:1,>:8]'\n"
        "export PYTORCH_ALLOC_CONF='expandable_segments:True,roundup_power2_divisions:[256:1,>:8]'"
    )
    assert out["powershell"] == (
        "$env:PYTORCH_CUDA_ALLOC_CONF = 'expandable_segments:True,roundup_power2_divisions:[256:1,>:8]'\n"
        "$env:PYTORCH_ALLOC_CONF = 'expandable_segments:True,roundup_power2_divisions:[256:1,>:8]'"
    )
    assert out["cmd"] == (
        'set "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,roundup_power2_divisions:[256:1,>:8]"\n'
        'set "PYTORCH_ALLOC_CONF=expandable_segments:True,roundup_power2_divisions:[256:1,>:8]"'
    )
    py = out["python"].splitlines()
    assert py[0] == "import os"
    assert 'os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True,roundup_power2_divisions:[256:1,>:8]"' in py
    # the assignments come before the import of torch
    assert py.index("import torch  # only after the variables are set: the allocator reads them once") > max(
        i for i, line in enumerate(py) if line.startswith("os.environ[")
    )


def test_render_with_command():
    a = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
    cmd = ["python", "my app.py", "--n", "a&b", "it's"]
    assert render(a, "bash", cmd) == "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128 python 'my app.py' --n 'a&b' 'it'\\''s'"
    assert render(a, "pwsh", cmd) == "$env:PYTORCH_CUDA_ALLOC_CONF = 'max_split_size_mb:128'\npython 'my app.py' --n 'a&b' 'it''s'"
    assert render(a, "cmd", cmd) == 'set "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128"\npython "my app.py" --n "a&b" "it\'s"'
    assert render(a, "python", cmd).splitlines()[-1] == (
        'subprocess.run(["python", "my app.py", "--n", "a&b", "it\'s"], env=env, check=True)'
    )
    # a quoted program name needs PowerShell's call operator
    assert render(a, "powershell", ["C:\\Program Files\\py.exe", "x.py"]).endswith("& 'C:\\Program Files\\py.exe' x.py")


def test_quoting_edge_cases():
    assert quote_bash("") == "''"
    assert quote_bash("a b") == "'a b'"
    assert quote_bash("$HOME") == "'$HOME'"
    assert quote_powershell("a,b") == "'a,b'"  # bare a,b would be an array
    assert quote_powershell("it\u2019s") == "'it\u2019\u2019s'"
    assert quote_powershell("$env:X") == "'$env:X'"
    assert quote_cmd("a|b") == '"a|b"'
    with pytest.raises(InputError):
        quote_cmd("100%")
    with pytest.raises(InputError):
        render({"X": 'say "hi"'}, "cmd")
    with pytest.raises(InputError):
        render({"BAD NAME": "1"}, "bash")
    with pytest.raises(InputError):
        render({"X": "1"}, "fish")
    with pytest.raises(InputError):
        render_all({"X": "1"}, command="python x.py")  # a string command fits one shell only


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("value", [LIST_CONF, "it's $HOME `x` \"q\" a\\b *", ""])
def test_bash_round_trip(value):
    """What bash actually puts in the environment equals the value we meant."""
    a = {"ALLOCTUNE_T1": value, "ALLOCTUNE_T2": "x"}
    probe = [sys.executable, "-c", "import os; print(repr(os.environ['ALLOCTUNE_T1']))"]
    for script in (render(a, "bash") + "\n" + " ".join(quote_bash(p) for p in probe), render(a, "bash", probe)):
        res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == repr(value)


@pytest.mark.skipif(shutil.which("pwsh") is None, reason="needs PowerShell (pwsh)")
def test_powershell_round_trip():
    value = "it's, [a] $x `b"
    script = render({"ALLOCTUNE_T1": value}, "powershell") + "\n[Console]::Out.Write($env:ALLOCTUNE_T1)"
    res = subprocess.run(["pwsh", "-NoProfile", "-Command", script], capture_output=True, text=True)
    assert res.stdout == value


@pytest.mark.parametrize("value", [LIST_CONF, 'quote " and \\ backslash', "unicode \u00e9\u2028"])
def test_python_round_trip(value, monkeypatch):
    """The Python form, executed, sets exactly the value (with `import torch` stubbed out)."""
    monkeypatch.delenv("ALLOCTUNE_T1", raising=False)
    code = render({"ALLOCTUNE_T1": value}, "python").replace("import torch", "pass")
    exec(compile(code, "<rendered>", "exec"), {})
    assert os.environ["ALLOCTUNE_T1"] == value
    monkeypatch.delenv("ALLOCTUNE_T1")


def test_python_command_runs():
    code = render({"ALLOCTUNE_T1": "v 1"}, "python", [sys.executable, "-c", "import os,sys; sys.exit(os.environ['ALLOCTUNE_T1'] != 'v 1')"])
    exec(compile(code, "<rendered>", "exec"), {})  # check=True raises if the child saw another value
