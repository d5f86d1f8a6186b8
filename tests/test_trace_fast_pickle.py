"""The fast safe load (screen, C load, check of what was built) proves what the opcode scan proves.

Each safety property has a test that fails if it breaks: the screen never admits an opcode that can
run code or grow the memo at will, nor a tuple that nests; what was built is held to every limit
with the scan's verdict and message; the shortcuts of the check (untracked dicts, tuple references)
are exact; and hostile streams made only of admitted opcodes are refused, through the fast path.
"""

from __future__ import annotations

import contextlib
import copyreg
import gc
import lzma
import pickle
import pickletools
import random
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hostile_probes as hp
from alloctune.errors import TraceError, UnsafePickleError
from alloctune.trace import pickle_check as pc
from alloctune.trace import pickle_scan as ps
from alloctune.trace import safe_pickle as sp
from alloctune.trace.limits import Limits
from alloctune.trace.safe_pickle import safe_loads, scanned_loads

# What protocol 4/5 writes for plain data; the screen may admit nothing else.
ADMITTED = {"PROTO", "FRAME", "MEMOIZE", "BINGET", "LONG_BINGET", "MARK", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE",
            "SETITEMS", "SETITEM", "APPENDS", "APPEND", "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2",
            "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "SHORT_BINBYTES", "BINBYTES", "TUPLE1", "TUPLE2",
            "TUPLE3", "TUPLE", "STOP"}


def opnames(data: bytes) -> set[str]:
    return {op.name for op, _, _ in pickletools.genops(data)}


def verdict(fn, data: bytes, limits: Limits):
    """('ok', value) or ('refused', the limit's variable or the error class)."""
    try:
        return "ok", fn(data, limits)
    except TraceError as exc:
        text = str(exc)
        tag = next((v for v in ("MAX_DEPTH", "MAX_CONTAINER", "MAX_OBJECTS", "contains itself") if v in text), text)
        return "refused", tag


# ---- the screen ---------------------------------------------------------------------------------------
def test_real_snapshots_take_the_fast_path():
    snap = hp.plain_snapshot(200)
    snap["segments"] = [{"address": 1, "segment_pool_id": (0, 0), "frames": [], "blocks": [{"frames": []}]}]
    for proto in (4, 5):
        data = pickle.dumps(snap, protocol=proto)
        got = ps.screen(data)
        assert got is not None and got.tuples == 1
        assert safe_loads(data) == snap


@pytest.mark.parametrize("name", [n for n, _ in hp.code_pickles(Path("/nonexistent"))])
def test_screen_never_admits_a_code_pickle(tmp_path, name):
    marker = tmp_path / "pwned"
    blob = dict(hp.code_pickles(marker))[name]
    assert ps.screen(blob) is None
    with pytest.raises(TraceError):
        safe_loads(blob)
    assert not marker.exists()


@pytest.mark.parametrize("blob", [hp.memo_bomb(), b"\x80\x04Nq\x05.", b"\x80\x04Np5\n.", b"\x80\x04N2\x86.",
                                  b"\x80\x04N0N.", b"\x80\x04(N1N.", b"\x80\x04\x8f(K\x01\x90.",
                                  b"\x80\x04(K\x01\x91."],
                         ids=["long_binput", "binput", "put", "dup", "pop", "pop_mark", "set", "frozenset"])
def test_screen_leaves_memo_indices_and_unusual_opcodes_to_the_scan(blob):
    assert ps.screen(blob) is None


_ANY_OP = st.sampled_from([
    b"N", b"K\x05", b"M\x01\x02", b"J\x01\x00\x00\x00", b"\x8c\x03abc", b"X\x02\x00\x00\x00hi", b"C\x01z",
    b"B\x01\x00\x00\x00z", b"\x8a\x02\xff\x7f", b"G" + bytes(8), b"\x88", b"\x89", b"\x94", b"h\x00", b"h\x01",
    b"j\x02\x00\x00\x00", b"(", b"]", b"}", b")", b"e", b"u", b"a", b"s", b"t", b"l", b"d", b"\x85", b"\x86",
    b"\x87", b"\x8f", b"\x90", b"\x91", b"0", b"1", b"2", b"q\x07", b"r\x00\x00\x01\x00", b"p1\n", b"g0\n",
    b"\x95\x05\x00\x00\x00\x00\x00\x00\x00", b"cos\nsystem\n", b"\x93", b"R", b"b", b"o", b"\x81", b"\x92",
    b"\x82\x01", b"Q", b"Pid\n", b"\x97", b"\x98", b"I1\n", b"S'a'\n", b"V\xe9\n", b"U\x01a", b"\x8e" + bytes(8),
])


@settings(max_examples=500, deadline=None)
@given(st.lists(_ANY_OP, max_size=40))
def test_the_screen_admits_only_plain_data_opcodes(ops):
    """Whatever the screen admits is made only of ADMITTED opcodes, each tuple only of literal scalars."""
    data = b"\x80\x04" + b"".join(ops) + b"."
    if ps.screen(data) is None:
        return
    names = [op.name for op, _, _ in pickletools.genops(data)]  # the screen tokenized it: so can genops
    assert set(names) <= ADMITTED, names
    for i, name in enumerate(names):
        if name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            k = int(name[-1])
            operands = [n for n in names[:i] if n != "MEMOIZE"][-k:]
            assert all(n in ("NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT",
                             "SHORT_BINUNICODE", "SHORT_BINBYTES") for n in operands), names


def test_nested_and_memo_fetched_tuples_are_left_to_the_scan():
    assert ps.screen(b"\x80\x04K\x01\x85.") is not None  # (1,)
    assert ps.screen(b"\x80\x04K\x01\x85\x85.") is None  # ((1,),): nests
    assert ps.screen(b"\x80\x04K\x01\x85\x94h\x00\x85.") is None  # a tuple fetched from the memo into another
    assert ps.screen(lzma.decompress(hp.tuple1_bomb())) is None  # the million-deep TUPLE1 that crashes CPython


def test_tuple_operands_are_read_from_token_boundaries_not_argument_bytes():
    # The 4 argument bytes of LONG_BINGET spell `K\x01K\x01`: read backwards they would look like two literals.
    inner = b"\x80\x04(K\x01K\x01\x86\x94t\x94"  # memo 0: ((1, 1),)... built by the scan-only path below
    assert ps.screen(inner + b".") is None  # TUPLE over a tuple result: not admitted
    trick = b"\x80\x04]\x94K\x01K\x01\x86\x94a(j" + b"K\x01K\x01" + b"K\x02\x86."
    assert ps.screen(trick) is None  # operands: the LONG_BINGET (maybe a tuple) and K\x02


def test_a_window_boundary_between_operands_does_not_change_the_verdict(monkeypatch):
    snap = {"segments": [{"pool": (i, i + 1)} for i in range(300)], "x": list(range(2000))}
    data = pickle.dumps(snap, protocol=4)
    for window in (512, 777, 1 << 16):
        monkeypatch.setattr(ps, "_WINDOW", window)
        monkeypatch.setattr(ps, "_OPERAND_SPAN", 300)
        got = ps.screen(data)
        assert got is not None and got.tuples == 300


# ---- the check of what was built: the scan's verdict and count ---------------------------------------
def _plain(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth > 6 or r < 0.3:
        return rng.choice([1, "ab", 2.5, None, True, 10**20, b"x", (1, 2), (3,), (4, 5, 6), (1, 2, 3, 4), ()])
    if r < 0.55:
        return [_plain(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if r < 0.85:
        return {rng.choice(["a", "b", "c", (1, 2), 5, (7,)]): _plain(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    return tuple(rng.randint(0, 300) for _ in range(rng.randint(1, 3)))


def _shared_structures(n: int, seed: int):
    rng = random.Random(seed)
    for _ in range(n):
        pool = [_plain(rng) for _ in range(3)]
        value = [rng.choice(pool) for _ in range(rng.randint(1, 5))] + [_plain(rng)]
        if rng.random() < 0.3:
            value = {"k": value, "z": [value, pool], (1, 2): pool[0]}
        yield value


@contextlib.contextmanager
def collector_off():
    """The garbage collector off, as `safe_pickle` keeps it between the load and `check_built`:
    `untracked_are_flat=True` holds only while no collection can untrack a tuple (one that ran in
    between made this file's tests fail now and then: a dict of untracked tuples looked flat)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def test_check_built_counts_exactly_what_the_scan_counts():
    fast = 0
    for value in _shared_structures(1500, seed=7):
        data = pickle.dumps(value, protocol=4)
        screened = ps.screen(data)
        if screened is None:
            continue
        fast += 1
        expected = ps.scan(data, Limits())
        with collector_off():
            built = pickle.loads(data)
            for flat in (False, True):
                assert pc.check_built(built, Limits(), len(data), tuples=screened.tuples,
                                      empty_tuples=screened.empty_tuples > 0, untracked_are_flat=flat) == expected
    assert fast > 1000


def test_a_collection_between_load_and_check_is_why_the_collector_stays_off():
    """The precondition above, shown: after a collection has untracked the tuples of a dict that
    holds only tuples of scalars, `untracked_are_flat=True` no longer counts that dict's items; the
    safe load (collector off, redone looking at every dict after any collection) still does."""
    value = {"k": [{"a": (1, 2), "b": (3, 4)} for _ in range(50)]}
    data = pickle.dumps(value, protocol=4)
    screened = ps.screen(data)
    expected = ps.scan(data, Limits())
    built = pickle.loads(data)
    gc.collect()  # untracks the tuples of scalars, then the dicts holding only them
    assert not gc.is_tracked(built["k"][0])
    assert pc.check_built(built, Limits(), len(data), tuples=screened.tuples, empty_tuples=False,
                          untracked_are_flat=True) != expected
    assert pc.check_built(built, Limits(), len(data), tuples=screened.tuples, empty_tuples=False,
                          untracked_are_flat=False) == expected
    assert safe_loads(data) == value


def test_fast_and_scanned_loads_agree_at_every_limit():
    """For limits just at and just under each structure's own depth, length and count: same verdict."""
    for value in _shared_structures(300, seed=11):
        data = pickle.dumps(value, protocol=4)
        if ps.screen(data) is None:
            continue
        count = ps.scan(data, Limits())
        for lim in (Limits(max_objects=count, objects_per_byte=0), Limits(max_objects=count - 1, objects_per_byte=0),
                    Limits(max_depth=1), Limits(max_depth=2), Limits(max_depth=3), Limits(max_container=3),
                    Limits(max_container=8)):
            assert verdict(safe_loads, data, lim) == verdict(scanned_loads, data, lim), (value, lim)


def test_a_tuple_key_is_found_although_keys_are_not_read():
    # the tuple is a key only: the values-only walk misses it, the reference accounting sends it round again
    value = {"a": [1], (1, 2): {"x": [[1]]}}
    data = pickle.dumps(value, protocol=4)
    assert ps.screen(data).tuples == 1
    with collector_off():
        assert pc.check_built(pickle.loads(data), Limits(), len(data), tuples=1, empty_tuples=False,
                              untracked_are_flat=True) == ps.scan(data)
    # one tuple, a value and (fetched from the memo) a key: referenced once more than found
    t = (5, 6)
    shared = {"v": t, t: 1}
    data = pickle.dumps(shared, protocol=4)
    assert ps.screen(data) is not None
    with collector_off():
        assert pc.check_built(pickle.loads(data), Limits(), len(data), tuples=1, empty_tuples=False,
                              untracked_are_flat=True) == ps.scan(data)
    with pytest.raises(TraceError, match="nest deeper than 1"):
        safe_loads(data, Limits(max_depth=1))


def test_an_untracked_tuple_is_counted_when_a_collection_ran(monkeypatch):
    """The shortcut (untracked dict = scalars only) holds only while no tuple was untracked: else exact."""
    t = tuple([1, 2, 3])
    gc.collect()  # a collection untracks a tuple of scalars ...
    assert not gc.is_tracked(t)
    d = {"t": t}  # ... and a dict holding only it stays untracked
    assert not gc.is_tracked(d)
    root = [d]
    exact = pc.check_built(root, Limits(), 100, tuples=1, empty_tuples=False, untracked_are_flat=False)
    assert exact == 1 + 1 + 2 + 3  # the list, the dict, its key and value, the tuple's 3 items
    # so the loader redoes the check without the shortcut whenever the collection count moved
    calls = []
    real = sp.check_built
    monkeypatch.setattr(sp, "check_built", lambda *a, **k: calls.append(k["untracked_are_flat"]) or real(*a, **k))
    counter = iter(range(100))
    monkeypatch.setattr(sp, "_collections", lambda: next(counter))
    data = pickle.dumps({"t": (1, 2, 3)}, protocol=4)
    assert safe_loads(data) == {"t": (1, 2, 3)}
    assert calls == [True, False]


def test_what_was_built_is_released_before_the_scan_words_a_refusal():
    data = pickle.dumps([[[[[1]]]]], protocol=4)
    with pytest.raises(TraceError, match=r"nest deeper than 3 levels.*\(at byte \d+\)"):
        safe_loads(data, Limits(max_depth=3))  # the scan's wording, with its byte offset


# ---- hostile streams made only of admitted opcodes: refused through the fast path --------------------------
def laughs_without_pop(levels: int = 9, width: int = 10) -> bytes:
    """'Billion laughs' from MEMOIZE and BINGET only (no POP, which the screen does not admit)."""
    p = bytearray(b"\x80\x04}\x94(\x8c\x01a\x94](" + b"K\x01" * width + b"e\x94")  # memo 0 dict, 1 'a', 2 level 0
    for level in range(1, levels + 1):
        p += b"\x8c\x01" + bytes([0x61 + level]) + b"\x94](" + (b"h" + bytes([2 * level])) * width + b"e\x94"
    p += b"u."
    return bytes(p)


def deep_lists(depth: int) -> bytes:
    return b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."


@pytest.mark.parametrize("blob,needle", [
    (laughs_without_pop(), "ALLOCTUNE_MAX_OBJECTS"),
    (deep_lists(100_000), "nest deeper than 64"),
    (hp.cycle(), "contains itself"),
    (b"\x80\x04](" + b"N" * 3000 + b"e.", "ALLOCTUNE_MAX_CONTAINER"),
])
def test_hostile_admitted_streams_are_refused_in_bounded_time(blob, needle):
    assert ps.screen(blob) is not None  # the fast path is what is tested
    start = time.monotonic()
    with pytest.raises(TraceError, match=needle) as info:
        safe_loads(blob, Limits(max_container=2000))
    assert "\n" not in str(info.value)
    assert time.monotonic() - start < 20


def test_dense_container_streams_are_left_to_the_scan():
    """A big stream of mostly container opcodes would cost far more memory built than a snapshot: scanned."""
    blob = deep_lists(600_000)  # 1.2 MB: 600k nested lists built would be ~45 MB of lists for nothing
    assert len(blob) > ps._DENSE_FROM
    assert ps.screen(blob) is None
    with pytest.raises(TraceError, match="nest deeper than 64"):
        safe_loads(blob)
    chain_ = b"\x80\x04]\x94" + b"".join(b"]j" + i.to_bytes(4, "little") + b"a\x94" for i in range(200_000)) + b"."
    assert len(chain_) > ps._DENSE_FROM and ps.screen(chain_) is None  # nesting through the memo, 8 bytes a level
    snap = pickle.dumps({"device_traces": [hp.plain_snapshot(20_000)["device_traces"][0]]}, protocol=4)
    assert len(snap) > ps._DENSE_FROM and ps.screen(snap) is not None  # a genuine snapshot is far less dense


def test_laughs_are_counted_without_expanding_them():
    blob = laughs_without_pop(levels=7)  # 10**7 leaves: over the 4M default, in a few hundred bytes
    built = pickle.loads(blob)
    start = time.monotonic()
    with pytest.raises(pc.OverLimit, match="expands to more than"):
        pc.check_built(built, Limits(), len(blob), tuples=0, empty_tuples=False, untracked_are_flat=True)
    assert time.monotonic() - start < 1.0
    raised = Limits(max_objects=10**9)
    assert pc.check_built(built, raised, len(blob), tuples=0, empty_tuples=False,
                          untracked_are_flat=True) == ps.scan(blob, raised)


# ---- globals ---------------------------------------------------------------------------------------------
def test_a_cached_extension_code_is_refused_without_being_called(tmp_path):
    """The C unpickler takes an extension code found in copyreg's cache without asking find_class."""
    calls = []
    code = 0x7ABD

    def spy(*args):
        calls.append(args)

    copyreg.add_extension(__name__, "spy_target", code)
    copyreg._extension_cache[code] = spy  # as if an earlier (trusted) unpickling had looked it up
    try:
        payload = b"\x80\x02\x83" + code.to_bytes(2, "little") + b")R."  # EXT2 code, (), REDUCE
        with pytest.raises(UnsafePickleError, match="spy_target"):
            safe_loads(payload)
        pickle.loads(payload)  # control: plain pickle does call it
        assert calls == [()]
    finally:
        copyreg._extension_cache.pop(code, None)
        copyreg.remove_extension(__name__, "spy_target", code)


def test_nothing_after_a_refused_global_is_read():
    # a global, then a memo bomb: refused by name; the bytes after the global are never parsed
    blob = b"\x80\x02cos\nsystem\n" + b"N\x72\xf0\xff\xff\xff" * 3 + b"."
    with pytest.raises(UnsafePickleError, match=r"os\.system"):
        safe_loads(blob)


# ---- real recordings -----------------------------------------------------------------------------------
TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
STACKS = Path(__file__).resolve().parent / "data" / "explain_gpu" / "train_leak.pickle.xz"  # real, with Python stacks


@pytest.mark.parametrize("path", [TRACES / "rvc_ec1" / "default.pickle.xz", STACKS], ids=["rvc_ec1", "train-stacks"])
def test_real_recordings_load_fast_and_unchanged(path):
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    data = lzma.decompress(path.read_bytes())
    screened = ps.screen(data)
    assert screened is not None
    assert safe_loads(data) == pickle.loads(data)
    with collector_off():
        built = pickle.loads(data)
        assert pc.check_built(built, Limits(), len(data), tuples=screened.tuples, empty_tuples=False,
                              untracked_are_flat=True) == ps.scan(data)


def test_plain_data_round_trips_through_the_fast_path_at_every_protocol_it_admits():
    value = {"device_traces": [[{"action": "alloc", "size": 2**40, "frames": [{"line": 3}]}]], "x": ("a", 1.5)}
    for proto in (2, 3, 4, 5):
        data = pickle.dumps(value, protocol=proto)
        assert safe_loads(data) == value
        if proto >= 4:
            assert ps.screen(data) is not None


def test_the_environment_limits_reach_the_fast_path(monkeypatch):
    monkeypatch.setenv("ALLOCTUNE_MAX_DEPTH", "3")  # it nests 4 deep: dict, list, list, dict
    data = pickle.dumps({"device_traces": [[{"a": 1}]]}, protocol=4)
    assert ps.screen(data) is not None
    with pytest.raises(TraceError, match="ALLOCTUNE_MAX_DEPTH"):
        sp.load_pickle_bytes(data)
    monkeypatch.setenv("ALLOCTUNE_MAX_DEPTH", "4")
    assert sp.load_pickle_bytes(data) == {"device_traces": [[{"a": 1}]]}
    monkeypatch.setenv("ALLOCTUNE_MAX_CONTAINER", "1")
    with pytest.raises(TraceError, match="ALLOCTUNE_MAX_CONTAINER"):
        sp.load_pickle_bytes(data)


# ---- the C token run equals the regular expression ------------------------------------------------------
def _regex_run_end(data, pos: int, end: int) -> int:
    return ps._patterns()[0].match(data, pos, end).end()


def test_native_token_run_equals_the_regex_on_real_and_mutated_streams():
    native = pytest.importorskip("alloctune.trace._screen").run_end
    assert ps._run_end() is native  # the screen uses it where it was built
    real = [lzma.decompress(p.read_bytes())
            for p in sorted((Path(__file__).parent / "data" / "explain_gpu").glob("*.pickle.xz"))[:2]]
    real.append(pickle.dumps(hp.plain_snapshot(300), protocol=4))
    rnd = random.Random(30)
    streams = list(real)
    for data in real:
        for _ in range(20):  # byte flips, cuts and random opcodes in real streams
            b = bytearray(data[: rnd.randrange(1, min(len(data), 400_000))])
            for _ in range(rnd.randrange(1, 50)):
                b[rnd.randrange(len(b))] = rnd.randrange(256)
            streams.append(bytes(b))
    streams += [bytes(rnd.randrange(256) for _ in range(5000)) for _ in range(20)]
    streams.append(bytes(b"\x8c\xff" + b"x" * 254))  # a length that runs past the end
    compared = 0
    for data in streams:
        n = len(data)
        for pos in [0, *(rnd.randrange(n) for _ in range(30))]:
            for end in (n, min(n, pos + rnd.randrange(1, 70_000)), pos):
                assert native(data, pos, end) == _regex_run_end(data, pos, end), (pos, end)
                compared += 1
        pos = 0  # and token by token along a whole stream, as the screen steps through windows
        while pos < n:
            end = min(n, pos + ps._WINDOW)
            got = native(data, pos, end)
            assert got == _regex_run_end(data, pos, end)
            compared += 1
            pos = got + 1 if got < end else got
    assert compared > 3000
    for bad in ((-1, 5), (10, 5)):
        with pytest.raises(ValueError):
            native(b"N" * 8, *bad)
    assert native(bytearray(b"NN"), 0, 99) == 2 and native(memoryview(b"NNX"), 0, 3) == 2


def test_screen_without_the_native_run_gives_the_same(monkeypatch):
    data = pickle.dumps(hp.plain_snapshot(300), protocol=4)
    want = ps.screen(data)
    monkeypatch.setenv("ALLOCTUNE_SCREEN", "python")
    ps._run_end.cache_clear()
    try:
        got = ps.screen(data)
    finally:
        monkeypatch.delenv("ALLOCTUNE_SCREEN")
        ps._run_end.cache_clear()
    assert want is not None and got is not None
    assert (got.tuples, got.empty_tuples) == (want.tuples, want.empty_tuples)
