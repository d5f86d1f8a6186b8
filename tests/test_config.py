"""Allocator-config model: PyTorch's grammar and limits per release, formatting, checks, CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alloctune.config import AllocatorConfig, parse_torch_version, roundup_table_of, setting_from_table, tokenize
from alloctune.config.checks import check, check_sweep_values
from alloctune.config.effective import check_setting
from alloctune.config.knobs import KNOB_BY_NAME, KNOBS, knobs_for
from alloctune.config.model import parse_detailed
from alloctune.config.parse import ConfigSyntaxError
from alloctune.errors import ConfigError, InputError
from alloctune.units import GiB, MiB

C = AllocatorConfig


def err(text: str, torch: str = "2.11") -> str:
    with pytest.raises(ConfigError) as info:
        C.parse(text, torch)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


# ---- torch versions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [("2.11.0+cu130", (2, 11)), ("2.11", (2, 11)), ("2.0.1", (2, 0)), ("2.15.0a0+git12ab", (2, 15)),
     ("2.10.0.dev20251001", (2, 10)), ("2.9.0rc1", (2, 9)), ((2, 4), (2, 4)), ((2, 4, 1), (2, 4))],
)
def test_parse_torch_version(text, expected):
    assert parse_torch_version(text) == expected


@pytest.mark.parametrize("text", ["1.13.1", "2.16", "3.0", "abc", "", "2"])
def test_parse_torch_version_rejects(text):
    with pytest.raises(InputError) as info:
        parse_torch_version(text)
    assert "2.0" in str(info.value) or "cannot read" in str(info.value)


# ---- tokenizer and grammar ------------------------------------------------------------------


def test_tokenize_punctuation_and_spaces():
    assert tokenize(" a : 1 ,b:[ 2:3 ,>:4] ,") == ["a", ":", "1", ",", "b", ":", "[", "2", ":", "3", ",", ">", ":",
                                                    "4", "]", ","]


def test_tokenize_whitespace_by_version():
    # ≤2.9 drops only ' ', 2.10+ any C whitespace.
    assert tokenize("expandable_segments:True\n", "2.9") == ["expandable_segments", ":", "True\n"]
    assert tokenize("expandable_segments:True\n", "2.10") == ["expandable_segments", ":", "True"]
    assert C.parse("expandable_segments:\tTrue\n", "2.10").expandable_segments is True
    assert "True/False" in err("expandable_segments:True\n", "2.9")


def test_empty_is_default():
    assert C.parse("") == C()
    assert C.parse(None) == C()
    assert C.parse("   ") == C()
    assert C().format() == ""


def test_fields_exact_values():
    c = C.parse(
        "backend:native,max_split_size_mb:128,max_non_split_rounding_mb:64,garbage_collection_threshold:0.7,"
        "expandable_segments:True,large_segment_size_mb:32,per_process_memory_fraction:0.5", "2.11")
    assert c.backend == "native"
    assert c.max_split_size == 134217728
    assert c.max_non_split_rounding == 64 * MiB
    assert c.garbage_collection_threshold == 0.7
    assert c.expandable_segments is True
    assert c.large_segment_size == 32 * MiB
    assert c.per_process_memory_fraction == 0.5
    assert c.roundup_power2_divisions is None
    assert c.roundup_table("2.11") == (0,) * 16


def test_trailing_comma_repeats_and_spaces():
    assert C.parse("max_split_size_mb:128,", "2.11").max_split_size == 128 * MiB
    assert C.parse("max_split_size_mb:128,max_split_size_mb:256").max_split_size == 256 * MiB
    assert C.parse(" max_split_size_mb : 128 , expandable_segments : True ").expandable_segments
    assert "stray ','" in err("max_split_size_mb:128,,expandable_segments:True")


def test_missing_values():
    assert "has no value" in err("max_split_size_mb", "2.11")
    assert "aborts" in err("max_split_size_mb", "2.11")
    assert "expected :" in err("max_split_size_mb", "2.9")
    assert "has no value" in err("max_split_size_mb:", "2.11")
    assert '"stoull"' in err("max_split_size_mb:,expandable_segments:True")
    assert "expected ','" in err("max_split_size_mb:128:256")


def test_unknown_keys_and_hints():
    assert err("foo:1", "2.11") == (
        "unknown key 'foo' (torch 2.11: \"Unrecognized key 'foo' in CUDA allocator config.\")")
    assert err("foo:1", "2.9") == "unknown key 'foo' (torch 2.9: \"Unrecognized CachingAllocator option: foo\")"
    assert "did you mean 'expandable_segments'" in err("expandible_segments:True")
    assert "not '='" in err("max_split_size_mb=128")
    assert "Max_split_size_mb" in err("Max_split_size_mb:128")  # keys are case-sensitive


@pytest.mark.parametrize(
    "key_value, first",
    [("expandable_segments:True", "2.1"), ("release_lock_on_cudamalloc:True", "2.2"),
     ("max_non_split_rounding_mb:64", "2.6"), ("graph_capture_record_stream_reuse:True", "2.9"),
     ("per_process_memory_fraction:0.5", "2.10"), ("pinned_reserve_segment_size_mb:64", "2.10"),
     ("large_segment_size_mb:32", "2.11"), ("throw_on_cudamalloc_oom:True", "2.12"),
     ("pinned_max_cached_size_mb:1024", "2.13")],
)
def test_keys_by_version(key_value, first):
    major, minor = parse_torch_version(first)
    C.parse(key_value, first)
    msg = err(key_value, f"{major}.{minor - 1}")
    assert "is not accepted by torch" in msg and f"exists in torch {first}" in msg


def test_aliases_become_canonical():
    c = C.parse("release_lock_on_hipmalloc:True,pinned_use_hip_host_register:True")
    assert c.format() == "release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True"
    assert c.get("release_lock_on_hipmalloc") == "True"


def test_booleans_exactly_true_false():
    assert err("expandable_segments:true", "2.11") == (
        "expandable_segments must be exactly True or False, got 'true' "
        "(torch 2.11: \"Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'true'\")")
    assert "Expected a single True/False argument for expandable_segments" in err("expandable_segments:1", "2.9")
    assert "at index 6" in err("max_split_size_mb:128,expandable_segments:yes", "2.12")
    assert C.parse("expandable_segments:False") == C()


def test_backend():
    assert C.parse("backend:cudaMallocAsync").backend == "cudaMallocAsync"
    assert "options are native and cudaMallocAsync" in err("backend:hipMallocAsync")


# ---- MB knobs -------------------------------------------------------------------------------


def test_max_split_size_minimum_by_version():
    assert "must be > 20" in err("max_split_size_mb:20", "2.9")
    assert C.parse("max_split_size_mb:21", "2.9").max_split_size == 21 * MiB
    assert C.parse("max_split_size_mb:20", "2.10").max_split_size == 20 * MiB
    assert err("max_split_size_mb:19", "2.10").endswith(
        '(torch 2.10: "CachingAllocator option max_split_size_mb too small, must be >= 20")')
    # 2.11+: at least large_segment_size_mb, which is read first whatever the order.
    assert "must be >= 25" in err("max_split_size_mb:20,large_segment_size_mb:25", "2.11")
    assert C.parse("max_split_size_mb:25,large_segment_size_mb:25", "2.11").max_split_size == 25 * MiB


def test_max_non_split_rounding_minimum_by_version():
    assert "must be > 20" in err("max_non_split_rounding_mb:20", "2.6")
    assert C.parse("max_non_split_rounding_mb:20", "2.10").max_non_split_rounding == 20 * MiB
    assert "max_non_split_rounding_mb too small, must be >= 20" in err("max_non_split_rounding_mb:19", "2.11")
    assert "must be >= 32" in err("large_segment_size_mb:32,max_non_split_rounding_mb:30", "2.11")


def test_large_segment_size():
    assert err("large_segment_size_mb:10") == (
        "large_segment_size_mb:10 is too small: it must be more than 10 "
        "(torch 2.11: \"CachingAllocator option large_segment_size_mb must be > 10 MB\")")
    c = C.parse("large_segment_size_mb:12")
    assert c.large_segment_size == 12 * MiB
    assert c.effective_large_segment_size("2.11") == 12 * MiB
    assert c.effective_max_non_split_rounding("2.11") == 12 * MiB  # NSR defaults to it from 2.11
    assert C().effective_max_non_split_rounding("2.6") == 20 * MiB


def test_mb_cap_and_number_reading():
    # PyTorch clamps to SIZE_MAX / 1 MiB; stoi (≤2.9) overflows at 2^31.
    c = C.parse("max_split_size_mb:99999999999999999", "2.11")
    assert c.max_split_size == 17592186044415 * MiB
    assert c.format() == "max_split_size_mb:17592186044415"
    assert '"stoi"' in err("max_split_size_mb:99999999999999999", "2.9")
    assert '"stoull"' in err("max_split_size_mb:abc", "2.11")
    assert '"stoi"' in err("max_split_size_mb:abc", "2.9")
    assert "must not be negative" in err("max_split_size_mb:-5")
    # Like stoull, leading digits count and the rest is ignored (check() says so).
    assert C.parse("max_split_size_mb:128MB").max_split_size == 128 * MiB
    assert C.parse("max_split_size_mb:0128").format() == "max_split_size_mb:128"


# ---- garbage collection and fraction --------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "1", "1.5", "-0.1", "0.0", "nan"])
def test_gc_threshold_bounds(value):
    assert "garbage_collect_threshold is invalid, set it in (0.0, 1.0)" in err(
        f"garbage_collection_threshold:{value}", "2.11")


def test_gc_threshold_old_messages():
    assert "garbage_collect_threshold too small, set it 0.0~1.0" in err("garbage_collection_threshold:0", "2.9")
    assert "garbage_collect_threshold too big, set it 0.0~1.0" in err("garbage_collection_threshold:1", "2.9")
    assert '"stod"' in err("garbage_collection_threshold:abc", "2.9")
    assert C.parse("garbage_collection_threshold:.5").garbage_collection_threshold == 0.5
    assert C.parse("garbage_collection_threshold:5e-1").format() == "garbage_collection_threshold:0.5"


def test_fraction():
    assert C.parse("per_process_memory_fraction:0").per_process_memory_fraction == 0.0
    assert C.parse("per_process_memory_fraction:1").per_process_memory_fraction == 1.0
    assert "per_process_memory_fraction is invalid, set it in [0.0, 1.0]" in err("per_process_memory_fraction:1.2")


def test_pinned_int_knobs():
    assert C.parse("pinned_num_register_threads:8").get("pinned_num_register_threads") == "8"
    assert "Number of register threads has to be power of 2" in err("pinned_num_register_threads:3")
    assert "less than or equal to 128" in err("pinned_num_register_threads:256")
    assert "Pinned reserve segment size has to be greater than 0" in err("pinned_reserve_segment_size_mb:0")


# ---- roundup_power2_divisions ---------------------------------------------------------------

LIST = "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"


def test_roundup_list_29_vs_211():
    # ≤2.9 '>' starts at the last key's bucket (overwriting 1024→4), 2.10+ after it.
    assert C.parse(LIST, "2.9").roundup_table("2.9") == (1,) * 9 + (2, 8) + (8,) * 5
    c = C.parse(LIST, "2.11")
    assert c.roundup_table("2.11") == (1,) * 9 + (2, 4) + (8,) * 5
    assert c.roundup_table("2.10") == c.roundup_table("2.11")
    assert c.roundup_power2_divisions == (("256", 1), ("512", 2), ("1024", 4), (">", 8))
    assert c.format() == LIST


def test_roundup_single_form():
    c = C.parse("roundup_power2_divisions:4")
    assert c.roundup_power2_divisions == 4
    assert c.roundup_table() == (4,) * 16
    assert C.parse("roundup_power2_divisions:1").roundup_table() == (1,) * 16
    assert err("roundup_power2_divisions:3") == (
        "roundup_power2_divisions:3: the number of divisions must be a power of 2 "
        "(torch 2.11: \"For roundups, the divisions has to be power of 2\")")
    assert "divisons has to be power of 2" in err("roundup_power2_divisions:0", "2.7")  # PyTorch's spelling ≤2.7


def test_roundup_c10_unit_test_cases():
    # Expected values of PyTorch's own AllocatorConfigTest.
    t = C.parse("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]").roundup_table()
    assert t[5] == 8 and t[7] == 2 and t[11] == 1  # 32 MiB, 128 MiB, 2048 MiB
    t = C.parse("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]").roundup_table()
    assert t[10] == 0  # 1024 MiB: a gap between keys stays 0
    assert t == (8,) * 8 + (16, 1, 0, 8) + (2,) * 4


def test_roundup_list_edges():
    assert C.parse("roundup_power2_divisions:[>:8]", "2.9").roundup_table("2.9") == (8,) * 16
    assert C.parse("roundup_power2_divisions:[>:8]", "2.11").roundup_table("2.11") == (0,) + (8,) * 15
    assert C.parse("roundup_power2_divisions:[65536:2]").roundup_table() == (2,) * 16  # clamped to bucket 15
    assert C.parse("roundup_power2_divisions:[]").roundup_table() == (0,) * 16
    assert C.parse("roundup_power2_divisions:[256:1,]").roundup_table() == (1,) * 9 + (0,) * 7
    assert "For roundups, the intervals have to be power of 2" in err("roundup_power2_divisions:[300:2]")
    assert "power of 2 or 0 to disable roundup" in err("roundup_power2_divisions:[256:3]")
    assert "no closing ']'" in err("roundup_power2_divisions:[256:2")
    # 0 in a list disables rounding from 2.4 on; 2.3 refuses it.
    assert C.parse("roundup_power2_divisions:[256:0,>:4]", "2.4").roundup_table("2.4") == (0,) * 8 + (4,) * 8
    assert "divisons has to be power of 2" in err("roundup_power2_divisions:[256:0]", "2.3")


def test_roundup_repeated_key_accumulates():
    c = C.parse("roundup_power2_divisions:[256:1,>:8],roundup_power2_divisions:[1024:4]", "2.11")
    # second list refills buckets 0..10 with 4; 11..15 keep the first list's '>' value
    assert c.roundup_table("2.11") == (4,) * 11 + (8,) * 5
    assert C.parse(c.format(), "2.11") == c
    assert c.roundup_table("2.9") == c.roundup_table("2.11")  # stored without '>'
    assert C.parse("roundup_power2_divisions:[256:1],roundup_power2_divisions:2").roundup_power2_divisions == 2


def test_setting_from_table():
    assert setting_from_table((0,) * 16) is None
    assert setting_from_table((4,) * 16) == 4
    table = (1,) * 9 + (2, 4) + (8,) * 5
    s = setting_from_table(table)
    assert roundup_table_of(s, "2.9") == table == roundup_table_of(s, "2.14")


# ---- format, normalize, env -----------------------------------------------------------------


def test_format_canonical_order_and_spelling():
    c = C.parse("release_lock_on_hipmalloc:True,expandable_segments:True,garbage_collection_threshold:0.60,"
                "max_split_size_mb:0256,backend:native")
    assert c.format() == ("max_split_size_mb:256,garbage_collection_threshold:0.6,expandable_segments:True,"
                          "release_lock_on_cudamalloc:True")


def test_normalized():
    c = C.parse("large_segment_size_mb:20,max_non_split_rounding_mb:20,per_process_memory_fraction:1.0,"
                "release_lock_on_cudamalloc:False,pinned_num_register_threads:1,"
                "roundup_power2_divisions:[1:0],max_split_size_mb:256", "2.11")
    assert c.format() == ("large_segment_size_mb:20,max_split_size_mb:256,max_non_split_rounding_mb:20,"
                          "roundup_power2_divisions:[1:0],per_process_memory_fraction:1.0,"
                          "release_lock_on_cudamalloc:False,pinned_num_register_threads:1")
    n = c.normalized()
    assert n.format() == "max_split_size_mb:256"
    assert n.normalized() == n
    # A list giving one value everywhere in every release becomes the single form; '>' lists stay.
    assert C.parse("roundup_power2_divisions:[32768:4]").normalized().roundup_power2_divisions == 4
    assert C.parse("roundup_power2_divisions:[>:4]").normalized().roundup_power2_divisions == ((">", 4),)


def test_to_env_sets_both_variables():
    c = C.parse("expandable_segments:True")
    assert c.to_env() == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                          "PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    base = {"PATH": "/bin", "PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}
    env = c.to_env(base)
    assert env["PATH"] == "/bin" and env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert base["PYTORCH_ALLOC_CONF"] == "max_split_size_mb:64"  # not mutated
    assert C().to_env() == {"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": ""}


def test_dict_round_trip_and_constructor_validation():
    c = C.parse(LIST + ",max_split_size_mb:128,pinned_num_register_threads:4")
    d = json.loads(json.dumps(c.to_dict()))
    assert d["schema"] == "alloctune.allocator-config/1" and d["string"] == c.format()
    assert C.from_dict(d) == c
    assert C.from_dict({**d, "schema": 1}) == c  # files written before the shared schema form
    with pytest.raises(ConfigError):
        C(max_split_size=100)  # not a whole MiB
    with pytest.raises(ConfigError):
        C(garbage_collection_threshold=1.0)
    with pytest.raises(ConfigError):
        C(roundup_power2_divisions=3)
    with pytest.raises(ConfigError):
        C(backend="other")
    with pytest.raises(ConfigError):
        C.from_dict({"schema": 99})
    assert C(max_split_size=128 * MiB) == C.parse("max_split_size_mb:128")


# ---- snapshots' allocator_settings ----------------------------------------------------------

_ZERO = {str(1 << i): 0 for i in range(16)}
_BASE = {"max_split_size": -1, "garbage_collection_threshold": 0.0, "expandable_segments": False,
         "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
         "pinned_use_cuda_host_register": False, "graph_capture_record_stream_reuse": False,
         "roundup_power2_divisions": _ZERO}


def test_from_allocator_settings_recorded_dicts():
    # Values as recorded by torch 2.11 on the H200 traces in ../shared/traces.
    assert C.from_allocator_settings({**_BASE, "PYTORCH_CUDA_ALLOC_CONF": ""}) == C()
    gc = C.from_allocator_settings({**_BASE, "PYTORCH_CUDA_ALLOC_CONF":
                                    "garbage_collection_threshold:0.7,max_split_size_mb:256",
                                    "max_split_size": 268435456, "garbage_collection_threshold": 0.7})
    assert gc.max_split_size == 256 * MiB and gc.garbage_collection_threshold == 0.7
    rd = {**_ZERO, **{str(1 << i): 1 for i in range(9)}, "512": 2, "1024": 4,
          **{str(1 << i): 8 for i in range(11, 16)}}
    c = C.from_allocator_settings({**_BASE, "PYTORCH_CUDA_ALLOC_CONF": LIST, "roundup_power2_divisions": rd})
    assert c.format() == LIST  # the string agrees with the recorded table: its list is kept
    # Without the string the recorded values alone rebuild an equivalent config.
    c2 = C.from_allocator_settings({**_BASE, "PYTORCH_CUDA_ALLOC_CONF": "", "roundup_power2_divisions": rd})
    assert c2.roundup_table() == c.roundup_table() == (1,) * 9 + (2, 4) + (8,) * 5
    # Recorded values win over a string that disagrees with them.
    c3 = C.from_allocator_settings({**_BASE, "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128",
                                    "max_split_size": 512 * MiB, "release_lock_on_cudamalloc": True})
    assert c3.format() == "max_split_size_mb:512,release_lock_on_cudamalloc:True"


def test_from_allocator_settings_real_snapshot(traces_dir):
    safe = pytest.importorskip("alloctune.trace.safe_pickle")
    snap = safe.load_pickle_file(traces_dir / "llm" / "roundup_intervals.pickle.xz")
    c = C.from_allocator_settings(snap["allocator_settings"], "2.11.0+cu130")
    # The run on real torch 2.11 recorded the 2.10+ meaning of '>' (1024 MiB bucket keeps 4).
    assert c.roundup_table("2.11") == (1,) * 9 + (2, 4) + (8,) * 5
    assert c == C.parse(LIST, "2.11")


# ---- knob table -----------------------------------------------------------------------------


def test_knob_table():
    names = [k.name for k in KNOBS]
    assert len(names) == len(set(names)) == 18
    assert {k.name for k in knobs_for((2, 0))} == {"backend", "max_split_size_mb", "roundup_power2_divisions",
                                                   "garbage_collection_threshold"}
    assert "large_segment_size_mb" in {k.name for k in knobs_for((2, 11))}
    assert KNOB_BY_NAME["pinned_num_register_threads"].affects_allocation is False
    assert KNOB_BY_NAME["expandable_segments"].to_dict()["first"] == "2.1"
    # Every knob a release accepts parses in that release (and its value kinds are known).
    for knob in KNOBS:
        assert knob.kind in ("mb", "int", "float", "bool", "backend", "roundup")


# ---- checks ---------------------------------------------------------------------------------


def codes(ws):
    return [w.code for w in ws]


def test_check_gc_without_cap():
    assert codes(check("garbage_collection_threshold:0.7")) == ["gc-without-cap"]
    assert codes(check("garbage_collection_threshold:0.7", fraction=0.9)) == []
    assert codes(check("garbage_collection_threshold:0.7,per_process_memory_fraction:0.8")) == []
    # 2.10+ enables the cap only for f < 1; ≤2.9 for any call.
    assert codes(check("garbage_collection_threshold:0.7", fraction=1.0)) == ["gc-without-cap"]
    assert codes(check("garbage_collection_threshold:0.7", "2.9", fraction=1.0)) == []


def test_check_async_backend():
    ws = check("backend:cudaMallocAsync,max_split_size_mb:128,roundup_power2_divisions:4")
    assert codes(ws) == ["inert-under-async"]
    assert "max_split_size_mb, roundup_power2_divisions" in ws[0].message
    assert codes(check("backend:cudaMallocAsync")) == []


def test_check_expandable():
    assert codes(check("expandable_segments:True", platform="windows")) == ["expandable-windows"]
    assert codes(check("expandable_segments:True")) == []
    assert codes(check(C(expandable_segments=True), "2.0")) == ["expandable-unsupported"]
    with pytest.raises(InputError):
        check("", platform="beos")


def test_check_max_split_sizes():
    assert codes(check("max_split_size_mb:150000", card=150 * GiB)) == []
    assert codes(check("max_split_size_mb:150000", card=140 * GiB)) == ["max-split-above-card"]
    assert codes(check("max_split_size_mb:80000", card=140 * GiB, fraction=0.5)) == ["max-split-above-card"]
    assert codes(check("max_split_size_mb:512", largest_segment=300 * MiB)) == ["max-split-no-op"]
    assert codes(check("max_split_size_mb:256", largest_segment=256 * MiB)) == []  # a 256 MiB block is oversize
    assert codes(check("max_non_split_rounding_mb:64")) == ["nsr-without-max-split"]


def test_check_version_and_text():
    ws = check(C(large_segment_size=32 * MiB), "2.10")
    assert codes(ws) == ["unknown-key"] and ws[0].severity == "error"
    ws = check(C(max_split_size=20 * MiB), "2.9")
    assert codes(ws) == ["invalid-for-version"] and "must be > 20" in ws[0].message
    assert codes(check("max_split_size_mb:128MB")) == ["ignored-suffix"]
    assert codes(check("max_split_size_mb:128,max_split_size_mb:256")) == ["repeated-key"]
    assert codes(check("expandable_segments:True", "2.9", env_var="PYTORCH_ALLOC_CONF")) == ["alloc-conf-ignored"]
    assert codes(check("expandable_segments:True", "2.10", env_var="PYTORCH_ALLOC_CONF")) == []
    assert codes(check("per_process_memory_fraction:0")) == ["fraction-zero"]
    with pytest.raises(ConfigError):
        check("max_split_size_mb:abc")
    assert check("")[0:] == []


def test_sweep_values_are_checked_before_anything_runs():
    # what `tune --knobs` tries: every value must be one torch accepts (#18.17)
    check_sweep_values({"garbage_collection_threshold": ("0.6", "0.8"), "max_split_size_mb": ()}, "2.11")
    check_sweep_values({"expandable_segments": ("True",), "roundup_power2_divisions": ("4",)}, "2.11")
    with pytest.raises(ConfigError, match=r"^--knobs garbage_collection_threshold=1.5: "):
        check_sweep_values({"garbage_collection_threshold": ("0.6", "1.5")}, "2.11")
    with pytest.raises(ConfigError, match="--knobs max_split_size_mb=5"):
        check_sweep_values({"max_split_size_mb": ("5",)}, "2.11")
    with pytest.raises(ConfigError, match="--knobs roundup_power2_divisions=3"):
        check_sweep_values({"roundup_power2_divisions": ("3",)}, "2.11")
    with pytest.raises(InputError, match="unknown knob"):
        check_sweep_values({"foo": ("1",)})


def test_check_setting_is_the_core_of_config_check():
    r = check_setting("garbage_collection_threshold:0.6", "2.11.0+cu130", card="80GiB")
    assert r.torch == "2.11" and r.effective["large_segment_size"] == 20 * MiB
    assert [w.code for w in r.warnings] == ["gc-without-cap"]
    assert r.env == {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6",
                     "PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.6"}
    assert "export PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6" in r.shells["bash"]
    assert r.to_dict()["schema"] == "alloctune.config-check/1"
    assert "max_non_split_rounding" not in check_setting("", "2.5").effective  # 2.6+ knob
    assert check_setting("", "2.11").env == {}


# ---- properties -----------------------------------------------------------------------------

_pow2 = st.sampled_from([1, 2, 4, 8, 16])
_mb_key = st.sampled_from([1, 2, 4, 16, 64, 256, 512, 1024, 4096, 32768, 65536])
_items = st.lists(st.tuples(st.one_of(_mb_key.map(str), st.just(">")), st.one_of(_pow2, st.just(0))), max_size=5)
_other = st.dictionaries(
    st.sampled_from(["release_lock_on_cudamalloc", "pinned_use_cuda_host_register", "throw_on_cudamalloc_oom",
                     "pinned_use_background_threads", "graph_capture_record_stream_reuse"]),
    st.sampled_from(["True", "False"]))


@st.composite
def configs(draw):
    lss = draw(st.none() | st.integers(11, 64))
    floor = lss or 20
    return C(
        backend=draw(st.sampled_from(["native", "cudaMallocAsync"])),
        max_split_size=draw(st.none() | st.integers(floor, 10**6).map(lambda m: m * MiB)),
        max_non_split_rounding=draw(st.none() | st.integers(floor, 4096).map(lambda m: m * MiB)),
        garbage_collection_threshold=draw(st.just(0.0) | st.floats(0.001, 0.999)),
        expandable_segments=draw(st.booleans()),
        large_segment_size=None if lss is None else lss * MiB,
        per_process_memory_fraction=draw(st.none() | st.floats(0.0, 1.0)),
        roundup_power2_divisions=draw(st.none() | _pow2 | _items.map(tuple)),
        other=tuple(draw(_other).items()),
    )


@settings(max_examples=150, deadline=None)
@given(configs())
def test_format_parse_round_trip(c):
    assert C.parse(c.format(), "2.14") == c
    n = c.normalized()
    assert n.normalized() == n
    assert C.parse(n.format(), "2.14") == n
    for v in ("2.9", "2.11"):
        assert n.roundup_table(v) == c.roundup_table(v)
    assert n.effective_max_non_split_rounding("2.11") == c.effective_max_non_split_rounding("2.11")
    assert n.effective_large_segment_size("2.11") == c.effective_large_segment_size("2.11")


_pieces = st.sampled_from([
    "max_split_size_mb", "expandable_segments", "roundup_power2_divisions", "garbage_collection_threshold",
    "large_segment_size_mb", "backend", "True", "False", "128", "20", "0.5", "4", "3", ">", "[", "]", ",", ":",
    " ", "256", "abc", "-1", "1e3", "native", "\t",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(_pieces, max_size=14).map("".join), st.sampled_from(["2.0", "2.5", "2.9", "2.10", "2.11", "2.14"]))
def test_any_text_parses_or_raises_config_error(text, torch):
    try:
        c = C.parse(text, torch)
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    # Whatever parses formats back to the same config in the same release.
    assert C.parse(c.format(), torch) == c
    assert c.normalized().normalized() == c.normalized()
    assert parse_detailed(text, torch).config == c


# ---- CLI ------------------------------------------------------------------------------------


def run_cli(capsys, *args):
    from alloctune.cli import main

    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, errtext = capsys.readouterr()
    return (info.value.code or 0), out, errtext


def test_cli_check_ok(capsys):
    code, out, _ = run_cli(capsys, "config", "check", "max_split_size_mb:0128,garbage_collection_threshold:0.6")
    assert code == 0
    assert "normalized: max_split_size_mb:128,garbage_collection_threshold:0.6" in out
    assert "gc-without-cap" in out
    assert "export PYTORCH_CUDA_ALLOC_CONF=" in out
    code, out, _ = run_cli(capsys, "config", "check", LIST, "--torch", "2.9")
    assert code == 0 and all(run in out for run in ("0–512MiB: 1", "512MiB–1GiB: 2", "1GiB–∞: 8"))
    code, out, _ = run_cli(capsys, "config", "check", LIST, "--torch", "2.11")
    assert code == 0 and all(run in out for run in ("0–512MiB: 1", "512MiB–1GiB: 2", "1GiB–2GiB: 4", "2GiB–∞: 8"))


def test_cli_check_json(capsys):
    code, out, _ = run_cli(capsys, "config", "check", LIST, "--torch", "2.9.1", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["schema"] == "alloctune.config-check/1"
    assert data["torch"] == "2.9"
    assert data["roundup_table"] == [1] * 9 + [2, 8] + [8] * 5
    assert data["normalized"] == LIST
    assert data["warnings"] == []
    assert data["env"] == {"PYTORCH_CUDA_ALLOC_CONF": LIST}
    assert data["effective"]["max_non_split_rounding"] == 20 * MiB


@pytest.mark.parametrize("bad", ["max_split_size_mb:abc", "roundup_power2_divisions:3", "foo:1"])
def test_cli_check_bad_input_one_line_exit_2(capsys, bad):
    code, out, errtext = run_cli(capsys, "config", "check", bad)
    assert code == 2
    assert out == ""
    assert errtext.count("\n") == 1 and errtext.startswith("alloctune: error: ")


def test_cli_check_options(capsys):
    code, out, _ = run_cli(capsys, "config", "check", "max_split_size_mb:200000", "--card", "80GiB", "--json")
    assert code == 0 and [w["code"] for w in json.loads(out)["warnings"]] == ["max-split-above-card"]
    code, out, _ = run_cli(capsys, "config", "check", "max_split_size_mb:128", "--platform", "windows",
                           "--shell", "powershell")
    assert code == 0 and "$env:PYTORCH_CUDA_ALLOC_CONF" in out
    code, _, errtext = run_cli(capsys, "config", "check", "", "--torch", "1.13")
    assert code == 2 and "not supported" in errtext
    code, _, errtext = run_cli(capsys, "config", "check", "", "--fraction", "2")
    assert code == 2
    for opt, value, needle in (("--card", "0GiB", "more than 0"), ("--card", "80", "give a unit"),
                               ("--fraction", "nan", "between 0 and 1"),
                               ("--largest-segment", "-1GiB", "more than 0")):
        code, out, errtext = run_cli(capsys, "config", "check", "", f"{opt}={value}")
        assert (code, out) == (2, "") and errtext.count("\n") == 1 and needle in errtext, (opt, errtext)


def test_cli_knobs(capsys):
    code, out, _ = run_cli(capsys, "config", "knobs", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["schema"] == "alloctune.config-knobs/1"
    assert len(data["knobs"]) == 18 and data["knobs"][0]["name"] == "backend"
    code, out, _ = run_cli(capsys, "config", "knobs", "--torch", "2.0", "--json")
    assert [k["name"] for k in json.loads(out)["knobs"]] == [
        "backend", "max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold"]
    code, out, _ = run_cli(capsys, "config", "knobs")
    assert code == 0 and "expandable_segments" in out


def test_cli_subprocess_and_no_torch_import():
    # End to end: the real exit code, and the core never imports torch.
    proc = subprocess.run([sys.executable, "-m", "alloctune", "config", "check", "max_split_size_mb:abc"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("alloctune: error: max_split_size_mb")
    code = ("import sys, alloctune.config, alloctune.config.checks; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_config_syntax_error_carries_torch_message():
    with pytest.raises(ConfigSyntaxError) as info:
        C.parse("roundup_power2_divisions:[300:2]")
    assert info.value.key == "roundup_power2_divisions"
    assert info.value.torch_message.startswith("For roundups, the intervals have to be power of 2")


# ---- differential: the real parser of the installed torch -----------------------------------

# Keys the generic c10 parser (in every torch ≥2.10 build, CPU ones too) handles itself; CUDA-only
# keys are skipped there and checked only by the CUDA hook, so they are left out of this test.
_GENERIC = {
    "max_split_size_mb": ["20", "21", "19", "64", "0128", "+64", "7MB", "abc", "99999999999999999", "0x10", "1e3"],
    "max_non_split_rounding_mb": ["20", "21", "12", "128", "5e-1"],
    "expandable_segments": ["True", "False", "true", "1"],
    "roundup_power2_divisions": ["1", "4", "3", "0", "[256:1,>:8]", "[>:4]", "[64:0,128:2]", "[]", "[65536:2]",
                                 "[256:2,]", "[300:2]", "[256:3]", "[0:2]", "[256:1", "[256:1,", "[abc:2]"],
    "garbage_collection_threshold": ["0.5", ".9", "5e-1", "0x0.8p0", "0", "1", "1.5", "nan", "inf", "abc", "0.5abc"],
    "large_segment_size_mb": ["11", "10", "20", "32", "64"],
    "pinned_use_background_threads": ["True", "False", "yes"],
}


def test_matches_installed_torch_parser():
    torch = pytest.importorskip("torch")
    set_settings = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    try:
        version = parse_torch_version(torch.__version__)
    except InputError:
        pytest.skip(f"torch {torch.__version__} is outside 2.0–2.15")
    if set_settings is None or version < (2, 11):
        pytest.skip("needs torch ≥2.11, whose generic allocator-config parser is callable without CUDA")
    import random

    rng = random.Random(1234)
    keys = list(_GENERIC)
    compared = rejected = 0
    for _ in range(400):
        parts = []
        for _ in range(rng.randint(1, 3)):
            key = rng.choice(keys)
            parts.append(f"{key}:{rng.choice(_GENERIC[key])}")
        text = ",".join(parts) + ("," if rng.random() < 0.2 else "")
        set_settings("large_segment_size_mb:20")  # torch keeps it across calls; start each string fresh
        try:
            set_settings(text)
            theirs = None
        except Exception as exc:  # ValueError, RuntimeError (internal assert), IndexError (stoull range)
            theirs = str(exc).splitlines()[0]
        try:
            C.parse(text, version)
            ours = None
        except ConfigSyntaxError as exc:
            ours = exc
        assert (theirs is None) == (ours is None), (text, theirs, ours)
        compared += 1
        if theirs is not None:
            rejected += 1
            mine = (ours.torch_message or "").strip()
            assert mine and mine in theirs, (text, theirs, str(ours))
    set_settings("")
    assert compared == 400 and 50 < rejected < 350


def test_windows_check_does_not_set_what_it_says_is_ignored(capsys):
    """#18.11a: after "expandable_segments is not supported on Windows", no line sets it."""
    code, out, _ = run_cli(capsys, "config", "check", "expandable_segments:True", "--platform", "windows",
                           "--shell", "powershell")
    assert code == 0 and "expandable-windows" in out
    assert "not setting expandable_segments: ignored on windows" in out
    assert "$env:" not in out and "set it" not in out and "nothing to set" not in out
    data = json.loads(run_cli(capsys, "config", "check", "expandable_segments:True", "--platform", "windows",
                              "--json")[1])
    assert data["env"] == {} and data["shell"] == {} and data["not_set"] == ["expandable_segments"]
    assert data["effective"]["expandable_segments"] is False  # PyTorch keeps it off there
    # the rest of a setting is still set, without the ignored knob
    data = json.loads(run_cli(capsys, "config", "check", "expandable_segments:True,max_split_size_mb:128",
                              "--platform", "windows", "--json")[1])
    assert set(data["env"].values()) == {"max_split_size_mb:128"}
    # on linux nothing changes
    data = json.loads(run_cli(capsys, "config", "check", "expandable_segments:True", "--json")[1])
    assert set(data["env"].values()) == {"expandable_segments:True"} and data["not_set"] == []


def test_an_unknown_last_key_is_what_torch_2_11_aborts_on():
    """On the H100 (tests/test_config_gpu.py, case bad_equals), torch 2.11 aborts on `max_split_size_mb=128` with
    "Index out of bounds in ConfigTokenizer": its generic pass skips an unknown key past its ':' and runs out
    of tokens before the CUDA pass names the key. With a value after it, the CUDA pass names it."""
    from alloctune.config.parse import ConfigSyntaxError

    with pytest.raises(ConfigSyntaxError) as last:
        AllocatorConfig.parse("max_split_size_mb=128", "2.11")
    assert last.value.torch_message == "Index out of bounds in ConfigTokenizer"
    assert "use ':' between a key and its value" in str(last.value)
    with pytest.raises(ConfigSyntaxError) as named:
        AllocatorConfig.parse("foo:1", "2.11")
    assert named.value.torch_message == "Unrecognized key 'foo' in CUDA allocator config."
    with pytest.raises(ConfigSyntaxError) as old:
        AllocatorConfig.parse("max_split_size_mb=128", "2.8")
    assert old.value.torch_message == "Unrecognized CachingAllocator option: max_split_size_mb=128"
