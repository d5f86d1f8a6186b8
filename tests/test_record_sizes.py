"""`alloctune record --size`: one fresh recording per input size, each with its sidecar, ready for `plan`.

Runs against `fake_torch` (the stand-in torch with a toy CUDA allocator the record tests use)
through the real agent, as `tests/test_workloads_record.py` does.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from record_child import cli_exit, fake  # noqa: F401  (fake is a fixture)

from alloctune.run.record import command_for_size, out_for_size, parse_sizes, sidecar_path
from alloctune.errors import InputError

MiB = 1 << 20
SIDECAR_KEYS = {"workload", "conf", "cap", "total_memory", "torch", "outcome", "stats", "wall_s", "size"}


# Size from the argument; a second buffer sized from ALLOCTUNE_SIZE (both laws linear in the size).
PROGRAM = """
    import os, sys, torch
    n = int(sys.argv[1])
    a = torch.empty(n * MiB + 4096, device="cuda")
    b = torch.empty(int(os.environ["ALLOCTUNE_SIZE"]) * 3 * MiB, device="cuda")
    del b
    if n >= 64:
        raise SystemExit(5)
"""


def test_naming_and_templates():
    assert out_for_size(Path("d/rvc.pickle.xz"), "14") == Path("d/rvc-14.pickle.xz")
    assert out_for_size(Path("d/run{size}s.pickle"), "7.5") == Path("d/run7.5s.pickle")
    assert sidecar_path(Path("d/rvc-14.pickle.xz")) == Path("d/rvc-14.json")
    assert command_for_size(["python", "x.py", "--seconds", "{size}", "--tag=s{size}"], "7") == [
        "python", "x.py", "--seconds", "7", "--tag=s7"]
    assert parse_sizes("7, 14,28") == ["7", "14", "28"]
    for bad in ("", "7,7", "7,x", "-1"):
        with pytest.raises(InputError):
            parse_sizes(bad)


def test_records_one_history_per_size_with_sidecars(fake, capfd):
    script = fake / "prog.py"
    script.write_text("MiB = 1 << 20\n" + textwrap.dedent(PROGRAM))
    out = fake / "prog.pickle.gz"
    code = cli_exit(["record", "--size", "4,8,16,64", "--out", str(out), "--workload", "toy", "--json", "--",
                 sys.executable, str(script), "{size}"])
    assert code == 1  # size 64 failed on purpose; the others are kept and so is its trace
    captured = capfd.readouterr()
    assert "failed at size(s) 64" in captured.err
    result = json.loads(captured.out[captured.out.index("{"):])
    assert result["schema"] == 1 and [r["size"] for r in result["recordings"]] == ["4", "8", "16", "64"]
    for r in result["recordings"]:
        side = json.loads(Path(r["sidecar"]).read_text())
        assert SIDECAR_KEYS <= set(side) and side["workload"] == "toy" and side["size"] == r["size"]
        assert side["stats"]["reserved_bytes.all.peak"] > 0 and side["total_memory"] > 0
        n = int(r["size"])
        assert side["command"][-1] == str(n)
        assert Path(r["out"]).name == f"prog-{n}.pickle.gz"
        assert side["outcome"] == ("ok" if n < 64 else "crash") or side["exit_code"] == (0 if n < 64 else 5)
    # bare files are plan inputs (sizes from their sidecars), and so is the whole directory
    assert cli_exit(["plan", str(fake / "prog-4.pickle.gz"), str(fake / "prog-8.pickle.gz"),
                 str(fake / "prog-16.pickle.gz"), "--size", "32", "--curve", "32", "--json"]) == 0
    d = json.loads(capfd.readouterr().out)
    assert d["recorded_sizes"] == ["4", "8", "16"] and d["traceset"]["laws"] == {"degree 1": 2}
    assert cli_exit(["plan", str(fake), "--curve", "32", "--hold-back", "8", "--json"]) == 0
    d = json.loads(capfd.readouterr().out)
    assert d["recorded_sizes"] == ["4", "8", "16", "64"]
    assert d["holdout"]["fitted_on"] == ["4", "16", "64"] and d["holdout"]["sizes_exact"] == 1.0
