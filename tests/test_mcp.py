"""`alloctune mcp`: each tool answers exactly what its command prints with `--json`, failures are
one line, and the GPU tools do nothing without `confirm: true`.

The server is driven through the SDK's own client, in process (memory streams) and once over
stdio against the real `python -m alloctune mcp`; the CLI side is the real command in a
subprocess, so a difference in arguments, defaults or JSON shaping between the two shows here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

mcp = pytest.importorskip("mcp", reason="the MCP SDK is the 'mcp' extra (pip install 'alloctune[mcp]')")
anyio = pytest.importorskip("anyio")

from alloctune.mcp.server import build_server  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "src" / "alloctune" / "data" / "traces"
DATA = REPO / "tests" / "data"
TOOLS = {"diagnose", "explain", "simulate", "plan", "config_check", "tune", "run"}


@asynccontextmanager
async def _client(target: Any) -> AsyncIterator[Any]:
    """A connected client session of the installed SDK (mcp 2's `Client`, else mcp 1's sessions)."""
    if hasattr(mcp, "Client"):
        async with mcp.Client(target) as client:
            yield client
        return
    if isinstance(target, mcp.StdioServerParameters):  # mcp 1
        async with mcp.stdio_client(target) as (read, write), mcp.ClientSession(read, write) as session:
            await session.initialize()
            yield session
        return
    from mcp.shared.memory import create_connected_server_and_client_session

    async with create_connected_server_and_client_session(target._mcp_server) as session:
        yield session


def _calls(target: Any, *calls: tuple[str, dict[str, Any]]) -> list[tuple[bool, str]]:
    """(is_error, text) of each tool call, in one session."""

    async def go() -> list[tuple[bool, str]]:
        async with _client(target) as client:
            out = []
            for name, args in calls:
                result = await client.call_tool(name, args)
                error = getattr(result, "is_error", getattr(result, "isError", False))
                out.append((bool(error), "".join(c.text for c in result.content)))
            return out

    return anyio.run(go)


def call(name: str, **args: Any) -> tuple[bool, str]:
    return _calls(build_server(), (name, args))[0]


def cli_json(*args: str) -> str:
    """stdout of the real command with --json (exit 0 or 1: simulate exits 1 for a predicted OOM)."""
    proc = subprocess.run([sys.executable, "-m", "alloctune", *args, "--json"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.stdout


def same_as_cli(tool: str, args: dict[str, Any], *cli_args: str) -> dict[str, Any]:
    error, text = call(tool, **args)
    assert not error, text
    assert text + "\n" == cli_json(*cli_args)  # byte for byte what the command prints
    answer: dict[str, Any] = json.loads(text)
    return answer


def test_lists_every_tool_with_its_schema():
    async def go() -> Any:
        async with _client(build_server()) as client:
            return (await client.list_tools()).tools

    tools = {t.name: t for t in anyio.run(go)}
    assert set(tools) == TOOLS
    schema = getattr(tools["simulate"], "input_schema", None) or tools["simulate"].inputSchema
    assert schema["required"] == ["recording"]
    assert schema["properties"]["settings"]["anyOf"][0] == {"items": {"type": "string"}, "type": "array"}
    assert "confirm" in (getattr(tools["tune"], "input_schema", None) or tools["tune"].inputSchema)["properties"]
    assert all(t.description for t in tools.values())


def test_diagnose_text_is_the_cli_json_of_the_same_log(oom_corpus, tmp_path):
    entries = {e["id"]: e["text"] for e in map(json.loads, oom_corpus.read_text(encoding="utf-8").splitlines())}
    for oom_id in ("oom-001", "oom-004"):
        log = tmp_path / f"{oom_id}.txt"
        log.write_text(entries[oom_id], encoding="utf-8")
        answer = same_as_cli("diagnose", {"text": entries[oom_id]}, "diagnose", str(log))
        assert answer["schema"] == "alloctune.diagnose/1" and answer["messages"] >= 1


def test_diagnose_snapshot_file_is_the_cli_json():
    snapshot = str(DATA / "cap_oom" / "seg.pickle.xz")
    answer = same_as_cli("diagnose", {"file": snapshot, "budget": "1.4GiB"}, "diagnose", snapshot, "--budget", "1.4GiB")
    assert answer["verdict"] == "fragmentation" and "map" not in answer


def test_explain_is_the_cli_json():
    rec = str(DATA / "explain_gpu" / "train_clean.pickle.xz")
    answer = same_as_cli("explain", {"recording": rec, "group": "function", "top": 5},
                         "explain", rec, "--group", "function", "--top", "5")
    assert answer["schema"] == "alloctune.explain/2" and answer["moment"]["reason"] == "peak"
    at = same_as_cli("explain", {"recording": rec, "at": 100, "what_if": False}, "explain", rec, "--at", "100", "--no-what-if")
    assert at["moment"]["event"] == 100


def test_simulate_is_the_cli_json():
    trace = str(TRACES / "rvc_h200.atrace")
    confs = ["", "expandable_segments:True", "max_split_size_mb:128"]
    answer = same_as_cli("simulate", {"recording": trace, "settings": confs, "min_budget": True},
                         "simulate", trace, *(a for c in confs for a in ("--conf", c)), "--min-budget")
    assert [r["conf"] for r in answer["rows"]] == confs and all(r["min_budget"] for r in answer["rows"])
    tight = same_as_cli("simulate", {"recording": trace, "budget": "1GiB"}, "simulate", trace, "--budget", "1GiB")
    assert tight["predicted_oom"] is True  # the CLI exits 1 here; the tool still answers the JSON


def test_plan_is_the_cli_json_but_for_wall_time():
    sizes = [str(DATA / "plan_sharp" / f"size_hubert_{n}.pickle.xz") for n in (8, 16, 24)]
    error, text = call("plan", recordings=sizes, cards=["4GiB", "8GiB"], settings=["", "expandable_segments:True"])
    assert not error, text
    cli = cli_json("plan", *sizes, "--card", "4GiB", "--card", "8GiB", "--conf", "", "--conf", "expandable_segments:True")

    def steady(data: dict[str, Any]) -> dict[str, Any]:
        return {k: steady(v) if isinstance(v, dict) else v for k, v in data.items() if not k.endswith("wall_s")}

    assert steady(json.loads(text)) == steady(json.loads(cli))


def test_config_check_is_the_cli_json():
    setting = "expandable_segments:True,garbage_collection_threshold:0.6"
    same_as_cli("config_check", {"setting": setting, "torch": "2.4", "platform": "windows"},
                "config", "check", setting, "--torch", "2.4", "--platform", "windows")
    same_as_cli("config_check", {"setting": ""}, "config", "check", "")


@pytest.mark.parametrize(("tool", "args", "says"), [
    ("explain", {"recording": "/no/such/recording.pickle"}, "no such file"),
    ("simulate", {"recording": str(TRACES / "rvc_h200.atrace"), "budget": "6 potatoes"}, "potatoes"),
    ("config_check", {"setting": "max_split_size_mb:1"}, "max_split_size_mb"),
    ("diagnose", {"text": "all is well, nothing ran out"}, "no out-of-memory message"),
    ("diagnose", {}, "either text"),
    ("explain", {"recording": str(TRACES / "rvc_h200.atrace"), "top": "many"}, "bad arguments: top"),
    ("simulate", {}, "bad arguments: recording"),
    ("no_such_tool", {}, "no_such_tool"),
])
def test_bad_arguments_are_one_line(tool, args, says):
    error, text = call(tool, **args)
    assert error
    assert text.startswith("alloctune: error: ") and "\n" not in text and "Traceback" not in text
    assert says in text


def test_gpu_tools_refuse_without_confirm_and_start_nothing(monkeypatch):
    import alloctune.run.runner
    import alloctune.tune.session

    def started(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a GPU tool started without confirm")

    monkeypatch.setattr(alloctune.tune.session, "prepare", started)
    monkeypatch.setattr(alloctune.run.runner, "run_trial", started)
    answers = _calls(build_server(), ("tune", {"command": ["python", "infer.py"], "budget": "6GiB"}),
                     ("run", {"command": ["python", "infer.py"], "confirm": False}))
    for (error, text), tool in zip(answers, ("tune", "run")):
        assert error and text == f"alloctune: error: {tool} runs the command on the GPU: call it again with confirm: " \
                                 "true to start it"


def test_tune_with_confirm_answers_the_outcome(monkeypatch):
    import alloctune.tune.session

    class Outcome:
        def to_dict(self) -> dict[str, Any]:
            return {"schema": "alloctune.tune/1", "recommendation": {"conf": "expandable_segments:True"}}

    seen: dict[str, Any] = {}

    def tune(command: list[str], **options: Any) -> Outcome:
        seen.update(options, command=command)
        return Outcome()

    monkeypatch.setattr(alloctune.tune.session, "tune", tune)
    error, text = call("tune", command=["python", "infer.py"], budget="6GiB", confirm=True)
    assert not error and json.loads(text) == Outcome().to_dict()
    assert seen["command"] == ["python", "infer.py"] and seen["budget"] == 6 << 30


def test_the_command_serves_over_stdio():
    params = mcp.StdioServerParameters(command=sys.executable, args=["-m", "alloctune", "mcp"], cwd=str(REPO))
    (error, text), = _calls(params, ("config_check", {"setting": "expandable_segments:True"}))
    assert not error and text + "\n" == cli_json("config", "check", "expandable_segments:True")


def test_the_package_imports_without_the_sdk_or_torch():
    code = ("import sys, alloctune.mcp.server, alloctune.mcp.tools; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
