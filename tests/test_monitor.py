"""`alloctune watch`: sampling over a fake NVML, live files joined by pid, CSV/JSON logs, the CLI."""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import pytest

from alloctune import monitor
from alloctune.errors import EnvironmentProblem
from alloctune.monitor import (
    CSV_COLUMNS,
    GpuInfo,
    Sample,
    SampleLog,
    read_csv_log,
    read_live_files,
    sample_table,
    samples,
    take_sample,
)
from alloctune.units import GiB, MiB


@dataclass
class FakeNvml:
    """In-memory NVML: fixed GPUs and per-device process lists."""

    gpus: Sequence[GpuInfo]
    procs: Mapping[int, Sequence[tuple[int, int | None]]] = field(default_factory=dict)
    closed: bool = False

    def device_count(self) -> int:
        return len(self.gpus)

    def device(self, index: int) -> GpuInfo:
        return self.gpus[index]

    def processes(self, index: int) -> list[tuple[int, int | None]]:
        return list(self.procs.get(index, ()))

    def close(self) -> None:
        self.closed = True


H200 = 150109880320
STATS = {
    "reserved_bytes.all.current": 6 * GiB,
    "reserved_bytes.all.peak": 8 * GiB,
    "allocated_bytes.all.current": 5 * GiB,
    "allocated_bytes.all.peak": 6 * GiB,
    "inactive_split_bytes.all.current": 300 * MiB,
    "num_alloc_retries": 4,
    "num_ooms": 1,
}


def live_file(d, pid, device=0, stats=STATS, **extra):
    data = {"schema": 1, "kind": "alloctune-live", "pid": pid, "rank": None, "local_rank": None,
            "cmd": ["python", "infer.py", "--batch", "8"], "time": 1000.0, "started": 990.0, "device": device,
            "device_name": "NVIDIA H200", "total_memory": H200, "budget": 10 * GiB, "conf": "expandable_segments:True",
            "stats": stats, **extra}
    (d / f"live-{pid}.json").write_text(json.dumps(data))


def fake():
    return FakeNvml(
        [GpuInfo("NVIDIA H200", H200, 20 * GiB, 87), GpuInfo("NVIDIA H200", H200, 0, None)],
        {0: [(4242, 7 * GiB), (5555, 13 * GiB)]},
    )


def alive(*pids):
    return lambda pid: pid in pids


def test_sample_joins_nvml_and_live_files_by_pid(tmp_path):
    live_file(tmp_path, 4242)
    live_file(tmp_path, 7777, device=1)  # running, but NVML does not list it (e.g. pid namespace)
    live_file(tmp_path, 9999)  # left behind by a killed process
    (tmp_path / "live-1.json").write_text('{"kind": "alloctune-li')  # half-written / foreign
    s = take_sample(fake(), tmp_path, now=lambda: 1234.5, is_alive=alive(4242, 7777))
    assert s.time == 1234.5 and s.stale_live_files == 2
    g0, g1 = s.gpus
    assert (g0.index, g0.used, g0.total, g0.util) == (0, 20 * GiB, H200, 87)
    assert [p.pid for p in g0.processes] == [4242, 5555]
    a = g0.processes[0].allocator
    assert g0.processes[0].used == 7 * GiB
    assert (a.reserved, a.allocated, a.inactive_split, a.retries, a.ooms) == (6 * GiB, 5 * GiB, 300 * MiB, 4, 1)
    assert a.utilization == 0.75  # peak allocated / peak reserved
    assert a.cmd == "python infer.py --batch 8" and a.conf == "expandable_segments:True"
    assert g0.processes[1].allocator is None
    (p,) = g1.processes
    assert p.pid == 7777 and p.used is None and p.allocator.reserved == 6 * GiB


def test_no_state_dir_means_no_allocator_numbers(tmp_path):
    s = take_sample(fake(), tmp_path / "absent", is_alive=alive())
    assert s.stale_live_files == 0
    assert all(p.allocator is None for g in s.gpus for p in g.processes)


def test_utilization_falls_back_to_current_values(tmp_path):
    live_file(tmp_path, 4242, stats={"reserved_bytes.all.current": 4 * GiB, "allocated_bytes.all.current": GiB})
    live, _ = read_live_files(tmp_path, alive(4242))
    assert live[4242].utilization == 0.25 and live[4242].inactive_split is None


def test_csv_and_json_logs(tmp_path):
    live_file(tmp_path, 4242)
    s = take_sample(fake(), tmp_path, now=lambda: 10.0, is_alive=alive(4242))
    path = tmp_path / "watch.csv"
    stream = io.StringIO()
    log = SampleLog(path, stream)
    log.write(s)
    log.close()
    log = SampleLog(path)  # appending later does not repeat the header
    log.write(s)
    log.close()
    rows = read_csv_log(path)
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert len(rows) == 6  # 2 processes on GPU 0 + GPU 1 without processes, twice
    r = rows[0]
    assert (r["gpu"], r["pid"], r["proc_used"], r["reserved_bytes"], r["allocated_bytes"]) == (
        "0", "4242", str(7 * GiB), str(6 * GiB), str(5 * GiB))
    assert (r["inactive_split_bytes"], r["utilization"], r["num_alloc_retries"], r["num_ooms"]) == (
        str(300 * MiB), "0.7500", "4", "1")
    assert rows[1]["pid"] == "5555" and rows[1]["reserved_bytes"] == ""
    assert rows[2]["gpu"] == "1" and rows[2]["pid"] == "" and rows[2]["gpu_util"] == ""
    (line,) = stream.getvalue().splitlines()
    back = Sample.from_dict(json.loads(line))
    assert back == s


def test_samples_stop_after_count_and_keep_the_interval():
    t = [0.0]
    slept = []

    def sleep(d):
        slept.append(round(d, 6))
        t[0] += d

    def slow_now():  # each sample takes 0.2 s
        t[0] += 0.2
        return t[0]

    got = list(samples(fake(), 0.5, count=3, state_dir="/nonexistent", sleep=sleep, now=slow_now, clock=lambda: t[0]))
    assert len(got) == 3
    assert slept == [0.3, 0.3]  # on the 0.5 s grid despite the 0.2 s of work
    t[0], slept[:] = 0.0, []
    list(samples(fake(), 0.1, count=2, state_dir="/nonexistent", sleep=sleep, now=slow_now, clock=lambda: t[0]))
    assert slept == [0.0]  # a sample slower than the interval: the next follows at once


def test_view_renders_numbers(tmp_path):
    from rich.console import Console

    live_file(tmp_path, 4242)
    s = take_sample(fake(), tmp_path, is_alive=alive(4242))
    con = Console(record=True, width=80)
    con.print(sample_table(s, width=80))
    text = con.export_text()
    assert "0 NVIDIA" in text and "4242" in text
    assert "6.0G" in text and "300M" in text and "75.0 %" in text and "20.0G 14%" in text and "4/1" in text
    assert max(len(line) for line in text.splitlines()) <= 80  # all numbers fit an 80-column terminal
    wide = Console(record=True, width=120)
    wide.print(sample_table(s, width=120))
    wide_text = wide.export_text()
    assert "0 NVIDIA H200 87%" in wide_text and "4242 python infer.py --batch 8" in wide_text


def test_pynvml_without_driver_is_environment_problem(monkeypatch):
    import pynvml

    def boom():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", boom)
    with pytest.raises(EnvironmentProblem, match="cannot talk to the NVIDIA driver"):
        monitor.PynvmlFacade()


def test_cli_watch_with_fake_nvml(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from alloctune.cli import app

    live_file(tmp_path, os.getpid())
    nv = FakeNvml([GpuInfo("NVIDIA H200", H200, 20 * GiB, 50)], {0: [(os.getpid(), 7 * GiB)]})
    monkeypatch.setattr(monitor, "PynvmlFacade", lambda: nv)
    csv_path = tmp_path / "w.csv"
    res = CliRunner().invoke(app, ["watch", "--count", "2", "--interval", "0.01", "--json", "--csv", str(csv_path),
                                   "--state-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["schema"] == "alloctune.watch-sample/1"
    assert first["gpus"][0]["processes"][0]["allocator"]["stats"]["num_alloc_retries"] == 4
    assert len(read_csv_log(csv_path)) == 2 and nv.closed
    # The live view (no --json) also runs to completion with --count.
    res = CliRunner().invoke(app, ["watch", "--count", "1", "--state-dir", str(tmp_path)])
    assert res.exit_code == 0 and "alloctune watch" in res.output and "6.0G" in res.output


def test_cli_watch_without_driver_one_line_exit_2(monkeypatch):
    import subprocess
    import sys

    code = ("import pynvml, sys\n"
            "def boom(): raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)\n"
            "pynvml.nvmlInit = boom\n"
            "from alloctune.cli import main\n"
            "main(['watch', '--count', '1'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith("alloctune: error: cannot talk to the NVIDIA driver") and out.stderr.count("\n") == 1


def test_bad_arguments(monkeypatch):
    from typer.testing import CliRunner

    from alloctune.cli import app

    res = CliRunner().invoke(app, ["watch", "--interval", "0"])
    assert res.exit_code != 0
