"""`alloctune trace info|convert`: output on a real trace, JSON, one-line errors."""

from __future__ import annotations

import json
import lzma

import pytest

from alloctune.cli import main


def run(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    return info.value.code or 0, out, err


def test_info_json_on_rvc(traces_dir, capsys):
    code, out, _ = run(["trace", "info", str(traces_dir / "rvc_ec1" / "default.pickle.xz"), "--json"], capsys)
    assert code == 0
    d = json.loads(out)
    assert d["schema"] == "alloctune.trace-info/1"
    assert d["requests_by_kind"] == {"alloc": 14145, "free": 13616, "empty_cache": 16, "failed_alloc": 0}
    assert d["inferred_empty_cache"] == 16
    assert d["streams"] == [0]
    assert d["segment_events"] == {"segment_alloc": 135, "segment_free": 102}
    assert d["oom_events"] == 0
    stats = json.loads((traces_dir / "rvc_ec1" / "default.json").read_text())["stats"]
    assert d["peak_requested_bytes"] == stats["requested_bytes.all.peak"] == 1489533653
    assert d["recorded_peak_reserved_bytes"] == stats["reserved_bytes.all.peak"] == 1918894080
    assert d["allocator_settings"]["expandable_segments"] is False
    assert d["total_memory"] == 150109880320


def test_info_table(traces_dir, capsys):
    code, out, _ = run(["trace", "info", str(traces_dir / "rvc_ec1" / "default_cap85.pickle.xz")], capsys)
    assert code == 0
    assert "failed_alloc 1881" in out
    assert "inferred empty_cache()" in out and "1.50 GiB (1606418432 bytes)" in out


def test_convert_then_info_gives_the_same_numbers(traces_dir, tmp_path, capsys):
    src = traces_dir / "rvc_ec1" / "expandable.pickle.xz"
    out_file = tmp_path / "e.trace.xz"
    code, out, _ = run(["trace", "convert", str(src), str(out_file), "--json"], capsys)
    assert code == 0
    result = json.loads(out)
    assert result["schema"] == "alloctune.trace-convert/1"
    assert result["output_bytes"] == out_file.stat().st_size
    assert result["requests"] == 27777
    _, a, _ = run(["trace", "info", str(src), "--json"], capsys)
    _, b, _ = run(["trace", "info", str(out_file), "--json"], capsys)
    a, b = json.loads(a), json.loads(b)
    assert a.pop("source") != b.pop("source")
    assert a == b


def test_errors_are_one_line_exit_2(tmp_path, capsys):
    code, out, err = run(["trace", "info", str(tmp_path / "missing.pickle")], capsys)
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and err.startswith("alloctune: error: ") and "no such file" in err
    bad = tmp_path / "bad.pickle.xz"
    bad.write_bytes(lzma.compress(b"\x80\x04" + b"x" * 1000)[:30])
    code, _, err = run(["trace", "info", str(bad)], capsys)
    assert code == 2 and "truncated or corrupt" in err and err.strip().count("\n") == 0
