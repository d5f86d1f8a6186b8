"""Hostile and damaged files: every command ends in exit 0 with a right answer or exit 2 with one line,
under a memory limit and a time limit, and nothing in a file ever runs (issue #19, items 1-3)."""

from __future__ import annotations

import json
import lzma
import pickle
import random
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hostile_probes as hp
from alloctune.errors import TraceError, UnsafePickleError
from alloctune.trace.compact import encode, to_compact_dict
from alloctune.trace.limits import Limits
from alloctune.trace.load import load_trace, trace_from_snapshot
from alloctune.trace.pickle_scan import scan
from alloctune.trace.safe_pickle import load_pickle_bytes

MEM = 1536 * hp.MiB  # RLIMIT_AS for every CLI run below: far less than any bomb asks for


def one_line_exit_2(out: hp.Outcome, *needles: str) -> str:
    assert hp.verdict(out) == "clean" and out.rc == 2, (out.rc, out.stderr[-2000:])
    line = out.stderr.strip()
    for needle in needles:
        assert needle in line, line
    return line


# ---- the segfault, and the control that shows it is real ---------------------------------------------
def test_tuple1_file_is_tiny_and_crashes_the_c_unpickler(tmp_path):
    blob = hp.tuple1_bomb()
    assert len(blob) < 300
    code = f"import lzma, pickle; pickle.loads(lzma.decompress(open({str(tmp_path / 'x')!r}, 'rb').read()))"
    (tmp_path / "x").write_bytes(blob)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert res.returncode < 0  # SIGSEGV: what `trace info` did before the opcode scan


@pytest.mark.parametrize("command", [["trace", "info"], ["simulate"], ["diagnose", "--snapshot"], ["report"]])
def test_tuple1_file_is_one_line_in_every_command(tmp_path, command):
    path = tmp_path / "tuple1.pickle.xz"
    path.write_bytes(hp.tuple1_bomb())
    args = [*command, str(path)] + (["--out", str(tmp_path / "r")] if command == ["report"] else [])
    out = hp.run_cli(args, mem=MEM, timeout=60)
    one_line_exit_2(out, str(path), "nest deeper than 64", "ALLOCTUNE_MAX_DEPTH")


# ---- bombs under a memory limit ------------------------------------------------------------------------
def test_memo_bomb_is_refused_under_a_memory_limit(tmp_path):
    path = tmp_path / "memo.pickle"
    path.write_bytes(hp.memo_bomb())
    assert len(hp.memo_bomb()) == 9
    one_line_exit_2(hp.run_cli(["trace", "info", str(path)], mem=MEM, timeout=30), "memo index 4294967280")


@pytest.mark.parametrize("kind", ["xz", "gzip"])
def test_decompression_bomb_stops_at_the_limit(tmp_path, kind):
    # zeros: 1 GiB from xz, 512 MiB from gzip (whose ratio tops out near 1000:1)
    blob = hp.xz_bomb() if kind == "xz" else hp.gzip_bomb(total=512 * hp.MiB)
    assert len(blob) < 3 * hp.MiB
    path = tmp_path / f"bomb.pickle.{kind}"
    path.write_bytes(blob)
    out = hp.run_cli(["trace", "info", str(path)], mem=MEM, timeout=60)
    one_line_exit_2(out, "decompression bomb", "ALLOCTUNE_MAX_RATIO")


def test_decompression_limit_is_overridable(tmp_path):
    path = tmp_path / "zeros.pickle.xz"
    path.write_bytes(hp.xz_bomb(total=64 * hp.MiB))
    out = hp.run_cli(["trace", "info", str(path)], mem=MEM, timeout=60,
                     env={"ALLOCTUNE_MAX_RATIO": "1000000", "ALLOCTUNE_MAX_DECOMPRESSED": "32MiB"})
    one_line_exit_2(out, "ALLOCTUNE_MAX_DECOMPRESSED")
    # raised far enough, the zeros decompress and are then refused as a pickle, still one line
    out = hp.run_cli(["trace", "info", str(path)], mem=MEM, timeout=60, env={"ALLOCTUNE_MAX_RATIO": "1000000"})
    one_line_exit_2(out, "not a readable pickle")


def test_billion_laughs_is_refused_quickly(tmp_path):
    blob = hp.billion_laughs()
    assert len(blob) < 600
    with pytest.raises(TraceError, match="expands to more than"):
        load_pickle_bytes(blob)
    path = tmp_path / "laughs.pickle"
    path.write_bytes(blob)
    for args in (["trace", "info", str(path), "--json"], ["simulate", str(path), "--json"]):
        one_line_exit_2(hp.run_cli(args, mem=MEM, timeout=30), "ALLOCTUNE_MAX_OBJECTS")


def test_small_laughs_within_the_object_limit_are_refused_by_validation(tmp_path):
    # 3 levels = 1,000 leaves: allowed by the object budget, refused as allocator settings
    path = tmp_path / "laughs3.pickle"
    path.write_bytes(hp.billion_laughs(levels=2))
    one_line_exit_2(hp.run_cli(["trace", "info", str(path)], mem=MEM, timeout=30), "allocator_settings")


def test_cycle_is_refused():
    with pytest.raises(TraceError, match="contains itself"):
        load_pickle_bytes(hp.cycle())


def test_object_limit_scales_with_the_file_and_can_be_raised():
    blob = hp.billion_laughs(levels=5)  # 10**6 leaves from a few hundred bytes
    assert scan(blob, Limits()) > 10**6
    with pytest.raises(TraceError, match="ALLOCTUNE_MAX_OBJECTS"):
        scan(blob, Limits(max_objects=100_000))
    limits = Limits.from_env({"ALLOCTUNE_MAX_OBJECTS": "100000", "ALLOCTUNE_MAX_DEPTH": "3"})
    assert limits.max_objects == 100_000 and limits.max_depth == 3
    with pytest.raises(TraceError, match="nest deeper than 3"):
        scan(pickle.dumps({"device_traces": [[[[1]]]]}), limits)


# ---- nothing runs ---------------------------------------------------------------------------------------
def test_no_pickle_runs_code(tmp_path):
    marker = tmp_path / "pwned"
    for name, blob in hp.code_pickles(marker):
        with pytest.raises(TraceError):
            load_pickle_bytes(blob, source=name)
        path = tmp_path / f"{name}.pickle"
        path.write_bytes(blob)
        one_line_exit_2(hp.run_cli(["trace", "info", str(path)], mem=MEM, timeout=30))
    assert not marker.exists()
    with pytest.raises(UnsafePickleError, match="system"):
        load_pickle_bytes(hp.code_pickles(marker)[0][1])


# ---- wrong data in a well-formed file -------------------------------------------------------------------
@pytest.mark.parametrize("name,snap", hp.bad_value_snapshots(), ids=[n for n, _ in hp.bad_value_snapshots()])
def test_bad_values_are_refused_with_their_place(tmp_path, name, snap):
    path = tmp_path / f"{name}.pickle.xz"
    path.write_bytes(lzma.compress(pickle.dumps(snap)))
    with pytest.raises(TraceError) as info:
        load_trace(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg
    assert "device_traces[0][3]" in msg or "allocator_settings" in msg or "segments" in msg


def test_size_larger_than_the_device_in_the_sidecar(tmp_path):
    snap = hp.plain_snapshot()
    snap["device_traces"][0][3]["size"] = 100 * hp.GiB  # fine for 128 TiB, not for this 80 GiB card
    path = tmp_path / "big.pickle.xz"
    path.write_bytes(lzma.compress(pickle.dumps(snap)))
    (tmp_path / "big.json").write_text(json.dumps({"total_memory": 80 * hp.GiB}))
    with pytest.raises(TraceError, match=r"device_traces\[0\]\[3\] \(alloc\): size 107374182400 .*85899345920"):
        load_trace(path)


# ---- compact traces ------------------------------------------------------------------------------------
def _compact(total=80 * hp.GiB):
    t = trace_from_snapshot(hp.plain_snapshot(), source="probe")
    t.total_memory = total
    return t


def test_corrupted_compact_traces(tmp_path):
    good = _compact()
    body = to_compact_dict(good)
    path = tmp_path / "t.atrace"
    cases = {
        "flipped-xz": lambda: bytearray(hp.compact_bytes(good))[:40] + b"\x00" + hp.compact_bytes(good)[41:],
        "stale-checksum": lambda: hp.recompress_with({**body, "total_memory": 1}, fix_checksum=False),
        "truncated-body": lambda: lzma.compress(encode(good)[:-10]),
        "bad-header": lambda: lzma.compress(b"alloctune-trace 2 sha256=zz bytes=1\n{}"),
        "future-schema": lambda: lzma.compress(encode(good).replace(b"alloctune-trace 2", b"alloctune-trace 9", 1)),
    }
    req = body["requests"]
    sizes = list(req["sizes"])
    sizes[3] = 200 * hp.GiB  # checksum made to match: the content check must catch it
    cases["too-big-for-device"] = lambda: hp.recompress_with({**body, "requests": {**req, "sizes": sizes}})
    cases["free-of-unknown"] = lambda: hp.recompress_with(
        {**body, "requests": {**req, "free_back": [10**6] + req["free_back"][1:]}})
    cases["double-free"] = lambda: hp.recompress_with(
        {**body, "requests": {**req, "free_back": [req["free_back"][1]] + req["free_back"][1:]}})
    cases["unknown-op"] = lambda: hp.recompress_with({**body, "requests": {**req, "ops": "7" + req["ops"][1:]}})
    cases["n-mismatch"] = lambda: hp.recompress_with({**body, "requests": {**req, "n": 10**9}})
    cases["negative-total"] = lambda: hp.recompress_with({**body, "total_memory": -1})
    for name, make in cases.items():
        path.write_bytes(bytes(make()))
        with pytest.raises(TraceError) as info:
            load_trace(path)
        assert "\n" not in str(info.value), name
    path.write_bytes(bytes(cases["too-big-for-device"]()))
    one_line_exit_2(hp.run_cli(["simulate", str(path)], mem=MEM, timeout=30), "does not fit the device")


def test_schema_1_files_are_still_read_and_checked(tmp_path):
    good = _compact()
    body = {**to_compact_dict(good), "schema": 1}
    path = tmp_path / "old.atrace"
    path.write_bytes(lzma.compress(json.dumps(body).encode()))
    assert load_trace(path).requests.sizes == good.requests.sizes
    sizes = list(body["requests"]["sizes"])
    sizes[3] = 200 * hp.GiB
    path.write_bytes(lzma.compress(json.dumps({**body, "requests": {**body["requests"], "sizes": sizes}}).encode()))
    with pytest.raises(TraceError, match="does not fit the device"):
        load_trace(path)


# ---- fuzz: generated pickles and compact traces --------------------------------------------------------
_SNAP = pickle.dumps(hp.plain_snapshot(12), protocol=4)
_OPS = st.sampled_from([b"N", b"K\x05", b"M\x01\x02", b"\x8c\x03abc", b"\x94", b"h\x00", b"h\x01", b"j\x02\x00\x00\x00",
                        b"(", b"]", b"}", b")", b"\x8f", b"e", b"u", b"a", b"s", b"t", b"l", b"d", b"\x85", b"\x86",
                        b"\x87", b"\x90", b"\x91", b"0", b"1", b"2", b"q\x07", b"r\x00\x00\x01\x00", b"g0\n", b"p1\n",
                        b"\x8a\x02\xff\x7f", b"G" + bytes(8), b"X\x02\x00\x00\x00hi", b"B\x01\x00\x00\x00z"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_OPS, max_size=60), st.booleans())
def test_generated_opcode_streams_load_or_fail_with_trace_error(ops, proto):
    blob = (b"\x80\x04" if proto else b"") + b"".join(ops) + b"."
    try:
        value = load_pickle_bytes(blob, source="gen")
    except TraceError as exc:
        assert "\n" not in str(exc)
        return
    assert value == pickle.loads(blob)  # what the scan admits is exactly what pickle builds (no globals here)


@settings(max_examples=300, deadline=None)
@given(st.randoms(use_true_random=False))
def test_damaged_snapshots_load_or_fail_with_trace_error(rnd):
    blob = hp.mutated(_SNAP, rnd, edits=rnd.randint(1, 4))
    try:
        snap = load_pickle_bytes(blob, source="fuzz")
    except TraceError:
        return
    if isinstance(snap, dict) and isinstance(snap.get("device_traces"), list):
        try:
            trace_from_snapshot(snap, source="fuzz", partial=True)
        except TraceError:
            pass


_BODY = to_compact_dict(trace_from_snapshot(hp.plain_snapshot(12), source="c"))


@settings(max_examples=300, deadline=None)
@given(st.randoms(use_true_random=False))
def test_damaged_compact_traces_load_consistently_or_fail(rnd):
    """Random edits to the JSON body (checksum recomputed): either refused, or a trace whose frees match."""
    body = json.loads(json.dumps(_BODY))
    req = body["requests"]
    for _ in range(rnd.randint(1, 3)):
        col = rnd.choice(["sizes", "free_back", "event_index_delta", "ops", "n", "total_memory"])
        if col in ("n", "total_memory"):
            body_target, key = (req, "n") if col == "n" else (body, "total_memory")
            body_target[key] = rnd.choice([-1, 0, 10**15, "x", None, 3])
        elif col == "ops":
            i = rnd.randrange(len(req["ops"]))
            req["ops"] = req["ops"][:i] + rnd.choice("01239x") + req["ops"][i + 1:]
        else:
            i = rnd.randrange(len(req[col]))
            req[col][i] = rnd.choice([-1, 0, 1, 10**15, 2**64, "7", None, 1.5])
    from alloctune.trace.compact import trace_from_compact_bytes

    blob = lzma.decompress(hp.recompress_with(body))
    try:
        t = trace_from_compact_bytes(blob, source="fuzz")
    except TraceError as exc:
        assert "\n" not in str(exc)
        return
    live = {}
    for op, size, rid in zip(t.requests.ops, t.requests.sizes, t.requests.rids):
        if op == 0:
            live[rid] = size
        elif op == 1:
            got = live.pop(rid)  # a FREE names a live allocation (a KeyError here would be a bug)
            assert size in (-1, got)  # -1: a generated stream that does not restate the size
