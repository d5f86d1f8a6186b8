"""alloctune.config against real torch (skipped without a device): does torch accept or reject each allocator
string as alloctune predicts (the same message where it rejects), and does the allocator run with the values
alloctune computes (max_split_size, GC threshold, expandable segments, the 16-bucket roundup table, inert
knobs), read back from `torch.cuda.memory._snapshot()`? Each case runs in a fresh Python process (the allocator
reads its environment once); the cases run side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from alloctune.config import AllocatorConfig, parse_torch_version
from alloctune.config.parse import ConfigSyntaxError
from alloctune.config.values import ENV_VARS
from alloctune.config.versions import format_version

pytestmark = pytest.mark.gpu

CUDA, ALLOC = "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"


def read_setting(environ: dict[str, str], torch: str) -> tuple[str | None, str]:
    """The variable torch reads and its text: up to 2.9 the first only, from 2.10 the first one set."""
    found = [v for v in ENV_VARS[:2 if parse_torch_version(torch) >= (2, 10) else 1] if v in environ]
    return (found[0], environ[found[0]]) if found else (None, "")

# (name, env, known deviation or None). A known deviation is where alloctune is stricter than torch on
# purpose (torch ≥2.10 does not check separators; negative numbers wrap around in C++).
CASES: list[tuple[str, dict[str, str], str | None]] = [
    ("default", {CUDA: ""}, None),
    ("unset", {}, None),
    ("max_split_128", {CUDA: "max_split_size_mb:128"}, None),
    ("max_split_min", {CUDA: "max_split_size_mb:20"}, None),
    ("max_split_huge", {CUDA: "max_split_size_mb:99999999999999999"}, None),
    ("nsr_64", {CUDA: "max_non_split_rounding_mb:64,max_split_size_mb:256"}, None),
    ("gc_07", {CUDA: "garbage_collection_threshold:0.7"}, None),
    ("gc_hex", {CUDA: "garbage_collection_threshold:0x0.8p0"}, None),
    ("expandable", {CUDA: "expandable_segments:True"}, None),
    ("expandable_tab", {CUDA: "expandable_segments:True\t"}, None),
    ("roundup_4", {CUDA: "roundup_power2_divisions:4"}, None),
    ("roundup_list", {CUDA: "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"}, None),
    ("roundup_gt_only", {CUDA: "roundup_power2_divisions:[>:8]"}, None),
    ("roundup_gap", {CUDA: "roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]"}, None),
    ("roundup_repeat", {CUDA: "roundup_power2_divisions:[256:1,>:8],roundup_power2_divisions:[1024:4]"}, None),
    ("roundup_clamp", {CUDA: "roundup_power2_divisions:[65536:2]"}, None),
    ("roundup_empty", {CUDA: "roundup_power2_divisions:[]"}, None),
    ("roundup_zero", {CUDA: "roundup_power2_divisions:[256:0,>:4]"}, None),
    ("lss_32", {CUDA: "large_segment_size_mb:32,max_split_size_mb:32"}, None),
    ("fraction", {CUDA: "per_process_memory_fraction:0.5"}, None),
    ("release_lock", {CUDA: "release_lock_on_cudamalloc:True"}, None),
    ("pinned_threads", {CUDA: "pinned_num_register_threads:8"}, None),
    ("pinned_reserve", {CUDA: "pinned_reserve_segment_size_mb:64"}, None),
    ("graph_reuse", {CUDA: "graph_capture_record_stream_reuse:True"}, None),
    ("suffix_mb", {CUDA: "max_split_size_mb:128MB"}, None),
    ("spaces_comma", {CUDA: " max_split_size_mb : 128 ,"}, None),
    ("repeat_key", {CUDA: "max_split_size_mb:128,max_split_size_mb:256"}, None),
    ("native_backend", {CUDA: "backend:native,max_split_size_mb:64"}, None),
    ("async_backend", {CUDA: "backend:cudaMallocAsync"}, None),
    ("alloc_conf_only", {ALLOC: "max_split_size_mb:256"}, None),
    ("both_vars", {CUDA: "max_split_size_mb:128", ALLOC: "expandable_segments:True"}, None),
    ("bad_abc", {CUDA: "max_split_size_mb:abc"}, None),
    ("bad_19", {CUDA: "max_split_size_mb:19"}, None),
    ("bad_roundup_3", {CUDA: "roundup_power2_divisions:3"}, None),
    ("bad_key", {CUDA: "foo:1"}, None),
    ("bad_case_key", {CUDA: "Expandable_segments:True"}, None),
    ("bad_equals", {CUDA: "max_split_size_mb=128"}, None),
    ("bad_bool", {CUDA: "expandable_segments:true"}, None),
    ("bad_gc", {CUDA: "garbage_collection_threshold:1.5"}, None),
    ("bad_lss", {CUDA: "large_segment_size_mb:10"}, None),
    ("bad_lss_order", {CUDA: "max_split_size_mb:20,large_segment_size_mb:25"}, None),
    ("bad_interval", {CUDA: "roundup_power2_divisions:[300:2]"}, None),
    ("bad_division", {CUDA: "roundup_power2_divisions:[256:3]"}, None),
    ("bad_fraction", {CUDA: "per_process_memory_fraction:1.5"}, None),
    ("bad_threads", {CUDA: "pinned_num_register_threads:3"}, None),
    ("newer_key", {CUDA: "throw_on_cudamalloc_oom:True"}, None),
    ("no_value", {CUDA: "max_split_size_mb"}, None),
    ("no_bracket", {CUDA: "roundup_power2_divisions:[256:1"}, None),
    ("double_comma", {CUDA: "max_split_size_mb:128,,expandable_segments:True"}, None),
    ("sep_comma", {CUDA: "expandable_segments,True"}, "separators"),
    ("negative", {CUDA: "max_split_size_mb:-5"}, "negative"),
]

CHILD = r"""
import json, sys, warnings
res = {"ok": False}
try:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch
        torch.cuda.init()
        x = torch.empty(1024, device="cuda")
        res["ok"] = True
        try:
            res["settings"] = torch.cuda.memory._snapshot().get("allocator_settings")
        except Exception as exc:
            res["snapshot_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        try:
            res["stat_max_split_size"] = torch.cuda.memory_stats().get("max_split_size")
            res["fraction"] = torch.cuda.get_per_process_memory_fraction()
        except Exception:
            pass
    res["warnings"] = [str(w.message).splitlines()[0] for w in caught]
except BaseException as exc:
    res["error_type"] = type(exc).__name__
    res["error"] = " ".join(str(exc).split())[:600]
print("@@RESULT@@" + json.dumps(res))
"""


def run_case(env_extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (CUDA, ALLOC)}
    env.update(env_extra)
    t0 = time.time()
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": "timeout", "rc": None}
    res: dict = {"ok": False}
    for line in proc.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            res = json.loads(line[len("@@RESULT@@"):])
    res["rc"] = proc.returncode
    res["stderr_tail"] = " ".join(proc.stderr.split())[-600:]
    res["stderr_head"] = " ".join(proc.stderr.split())[:600]  # an abort's message comes first, its frames after
    res["wall_s"] = round(time.time() - t0, 1)
    if proc.returncode < 0 or (proc.returncode != 0 and "error" not in res):
        res["aborted"] = True
        res.setdefault("error", res["stderr_tail"])
    return res


def recorded_values(settings: dict) -> dict:
    mss = settings.get("max_split_size")
    table = [0] * 16
    for k, v in (settings.get("roundup_power2_divisions") or {}).items():
        table[min(int(k).bit_length() - 1, 15)] = int(v)
    out = {
        "max_split_size": None if mss is None or mss == -1 else mss % (1 << 64),  # int64 of a size_t: -1 = no limit
        "garbage_collection_threshold": float(settings.get("garbage_collection_threshold") or 0.0),
        "expandable_segments": bool(settings.get("expandable_segments")),
        "roundup_table": table,
    }
    for key in ("release_lock_on_cudamalloc", "pinned_use_cuda_host_register", "graph_capture_record_stream_reuse"):
        if key in settings:
            out[key] = "True" if settings[key] else "False"
    if "pinned_num_register_threads" in settings:
        out["pinned_num_register_threads"] = str(settings["pinned_num_register_threads"])
    return out


def predicted_values(config: AllocatorConfig, version: str, recorded: dict) -> dict:
    out = {
        "max_split_size": config.max_split_size,
        "garbage_collection_threshold": config.garbage_collection_threshold,
        "expandable_segments": config.expandable_segments,
        "roundup_table": list(config.roundup_table(version)),
    }
    defaults = {"release_lock_on_cudamalloc": "False", "pinned_use_cuda_host_register": "False",
                "graph_capture_record_stream_reuse": "False", "pinned_num_register_threads": "1"}
    for key, default in defaults.items():
        if key in recorded:
            out[key] = config.get(key) or default
    return out



@pytest.fixture(scope="module")
def torch_runs() -> dict[str, dict]:
    """Every case's child, side by side, once for the module."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(zip((c[0] for c in CASES), pool.map(lambda case: run_case(case[1]), CASES)))


@pytest.fixture(scope="module")
def version() -> str:
    import torch

    return format_version(parse_torch_version(torch.__version__))


@pytest.mark.parametrize("name, env, deviation", CASES, ids=[c[0] for c in CASES])
def test_torch_agrees_with_the_prediction(torch_runs, version, name, env, deviation):
    got = torch_runs[name]
    _, text = read_setting(env, version)
    try:
        config: AllocatorConfig | None = AllocatorConfig.parse(text, version)
        mine = ""
    except ConfigSyntaxError as exc:
        config, mine = None, (exc.torch_message or "").strip()
    if deviation is not None and (got.get("ok") != (config is not None)):
        pytest.xfail(f"known deviation ({deviation}): alloctune is stricter than torch on purpose")
    if config is None:
        theirs = got.get("error", "") + " " + got.get("stderr_head", "")
        assert not got.get("ok"), f"torch accepted {text!r}, alloctune rejects it"
        assert (mine and mine in theirs) or (got.get("aborted") and "Index out of bounds" in mine), (mine, theirs)
        return
    assert got.get("ok"), f"torch rejected {text!r} ({got.get('error', '')[:200]}), alloctune accepts it"
    settings = got.get("settings")
    if settings is None:
        assert config.backend == "cudaMallocAsync", got.get("snapshot_error", "no allocator_settings in snapshot")
        return
    recorded = recorded_values(settings)
    predicted = predicted_values(config, version, recorded)
    if got.get("fraction") is not None:
        recorded["per_process_memory_fraction"] = got["fraction"]
        frac = config.per_process_memory_fraction
        predicted["per_process_memory_fraction"] = 1.0 if frac is None else frac
    assert {k: predicted.get(k) for k in recorded} == recorded
