"""The restricted unpickler: plain data loads, anything that names a global is refused."""

from __future__ import annotations

import gzip
import lzma
import os
import pickle
import pickletools

import pytest

from alloctune.errors import TraceError, UnsafePickleError
from alloctune.trace.safe_pickle import load_pickle_bytes, load_pickle_file, safe_loads, sniff_compression


class _RunsShell:
    """A classic malicious payload: unpickling calls os.system(cmd)."""

    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def _hostile(tmp_path, protocol):
    marker = tmp_path / f"pwned{protocol}"
    payload = pickle.dumps({"device_traces": [[_RunsShell(f"touch {marker}")]]}, protocol=protocol)
    return payload, marker


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_hostile_pickle_is_refused_and_runs_nothing(tmp_path, protocol):
    payload, marker = _hostile(tmp_path, protocol)
    with pytest.raises(UnsafePickleError) as info:
        safe_loads(payload)
    assert "posix.system" in str(info.value) or "nt.system" in str(info.value)
    assert not marker.exists()


def test_hostile_file_refused_with_file_name(tmp_path):
    payload, marker = _hostile(tmp_path, 4)
    path = tmp_path / "evil.pickle.xz"
    path.write_bytes(lzma.compress(payload))
    with pytest.raises(UnsafePickleError) as info:
        load_pickle_file(path)
    assert str(path) in str(info.value) and "system" in str(info.value)
    assert not marker.exists()


def test_the_hostile_payload_is_real(tmp_path):
    """Control: the same bytes through plain pickle do run the command (so the test above can fail)."""
    payload, marker = _hostile(tmp_path, 4)
    pickle.loads(payload)  # noqa: S301 - deliberately unsafe, on our own payload
    assert marker.exists()


def test_every_global_opcode_is_refused():
    # GLOBAL (protocol 0-3), STACK_GLOBAL (4+), INST/OBJ (old class pickles) all go through find_class.
    for payload, name in [
        (b"cbuiltins\neval\n(S'1+1'\ntR.", "builtins.eval"),
        (b"\x80\x04\x8c\x08builtins\x8c\x04exec\x93\x8c\x011\x85R.", "builtins.exec"),
        (b"(S'x'\nisubprocess\nPopen\n.", "subprocess.Popen"),
    ]:
        with pytest.raises(UnsafePickleError, match=name.replace(".", r"\.")):
            safe_loads(payload)


def test_extension_codes_are_refused():
    import copyreg

    module = os.getcwd.__module__  # 'posix' on Linux
    copyreg.add_extension(module, "getcwd", 0x7ABC)
    try:
        payload = pickle.dumps(os.getcwd, protocol=2)
        assert any(op.name.startswith("EXT") for op, _, _ in pickletools.genops(payload))
        with pytest.raises(UnsafePickleError, match=rf"{module}\.getcwd"):
            safe_loads(payload)
    finally:
        copyreg.remove_extension(module, "getcwd", 0x7ABC)


def test_persistent_ids_are_refused():
    payload = b"\x80\x02X\x03\x00\x00\x00abcQ."  # BINPERSID
    with pytest.raises(UnsafePickleError, match="persistent id"):
        safe_loads(payload)


def test_plain_snapshot_data_loads_unchanged():
    data = {
        "segments": [{"address": 2**47 + 5, "blocks": [], "segment_pool_id": (0, 0), "is_expandable": False}],
        "device_traces": [[{"action": "alloc", "addr": 1, "size": 512, "stream": 0, "time_us": 10**15}]],
        "allocator_settings": {"garbage_collection_threshold": 0.7, "roundup_power2_divisions": {"1": 0}},
        "misc": [None, True, 1.5, -(2**70), "é"],
    }
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert safe_loads(pickle.dumps(data, protocol=protocol)) == data
    # Protocol 4+ (what _dump_snapshot writes) also has opcodes for bytes and sets.
    extra = {"b": b"raw", "s": {2, 3}, "f": frozenset({1})}
    for protocol in (4, 5):
        assert safe_loads(pickle.dumps(extra, protocol=protocol)) == extra


@pytest.mark.parametrize("suffix", [".pickle", ".pickle.gz", ".pickle.xz", ".bin"])
def test_compression_is_sniffed_not_taken_from_the_suffix(tmp_path, suffix):
    data = {"device_traces": [[]], "n": 3}
    raw = pickle.dumps(data)
    for blob in (raw, gzip.compress(raw), lzma.compress(raw)):
        path = tmp_path / f"snap{suffix}"
        path.write_bytes(blob)  # e.g. xz content in a file named .pickle.gz
        assert load_pickle_file(path) == data


def test_sniff_compression():
    assert sniff_compression(lzma.compress(b"x")[:8]) == "xz"
    assert sniff_compression(gzip.compress(b"x")[:8]) == "gzip"
    assert sniff_compression(pickle.dumps({})[:8]) is None


def test_truncated_xz_is_a_one_line_trace_error(tmp_path):
    path = tmp_path / "t.pickle.xz"
    path.write_bytes(lzma.compress(pickle.dumps({"device_traces": [list(range(10000))]}))[:200])
    with pytest.raises(TraceError, match="xz stream is truncated or corrupt") as info:
        load_pickle_file(path)
    assert "\n" not in str(info.value)


def test_truncated_gzip_and_truncated_pickle(tmp_path):
    raw = pickle.dumps({"device_traces": [list(range(10000))]})
    gz = tmp_path / "t.pickle.gz"
    gz.write_bytes(gzip.compress(raw)[:100])
    with pytest.raises(TraceError, match="gzip stream is truncated or corrupt"):
        load_pickle_file(gz)
    plain = tmp_path / "t.pickle"
    plain.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TraceError, match="not a readable pickle"):
        load_pickle_file(plain)


def test_not_a_pickle_and_empty_and_missing(tmp_path):
    txt = tmp_path / "notes.pickle"
    txt.write_text("hello world\n")
    with pytest.raises(TraceError, match="not a readable pickle"):
        load_pickle_file(txt)
    empty = tmp_path / "empty.pickle"
    empty.write_bytes(b"")
    with pytest.raises(TraceError, match="empty"):
        load_pickle_file(empty)
    with pytest.raises(TraceError, match="no such file"):
        load_pickle_file(tmp_path / "absent.pickle")
    with pytest.raises(TraceError, match="is a directory"):
        load_pickle_file(tmp_path)


def test_load_pickle_bytes_names_its_source():
    with pytest.raises(TraceError, match="^mysrc: "):
        load_pickle_bytes(b"\x80\x04garbage", source="mysrc")


# ---- fuzz: damaged pickles fail with TraceError, never with anything else --------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_SNAP = pickle.dumps(
    {"device_traces": [[{"action": "alloc", "addr": 2**40 + i, "size": i * 512, "stream": 0} for i in range(20)]],
     "allocator_settings": {"roundup_power2_divisions": {"1": 0}, "gc": 0.5, "pool": (0, 0)}},
    protocol=4,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_SNAP) - 1), st.integers(0, 255)), min_size=1, max_size=4),
       st.integers(1, len(_SNAP)))
def test_damaged_pickles_raise_trace_error_only(edits, cut):
    data = bytearray(_SNAP[:cut])
    for pos, byte in edits:
        if pos < len(data):
            data[pos] = byte
    try:
        load_pickle_bytes(bytes(data), source="fuzz")
    except TraceError:
        pass


plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.lists(inner) | st.tuples(inner, inner) | st.dictionaries(st.text(), inner),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None)
@given(plain)
def test_plain_data_round_trips(value):
    assert safe_loads(pickle.dumps(value, protocol=4)) == value
