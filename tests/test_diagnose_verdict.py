"""Verdicts, evidence and fix values derived from the numbers; the Python API."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import alloctune
from alloctune.diagnose import Diagnosis, diagnose, diagnose_all
from alloctune.errors import InputError, NoOOMFound
from alloctune.units import GiB, MiB


def modern(req, total, free, alloc, unalloc, extra="", tail=""):
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req}. GPU 0 has a total capacity of {total} "
            f"of which {free} is free. {extra}Of the allocated memory {alloc} is allocated by PyTorch, and {unalloc} is "
            f"reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
            f"Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables){tail}")


def legacy(req, total, alloc, free, reserved, allowed=""):
    return (f"RuntimeError: CUDA out of memory. Tried to allocate {req} (GPU 0; {total} total capacity; {alloc} already "
            f"allocated; {free} free; {allowed}{reserved} reserved in total by PyTorch) If reserved memory is >> "
            f"allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory "
            f"Management and PYTORCH_CUDA_ALLOC_CONF")


def fix(d: Diagnosis, fid: str):
    return next(f for f in d.fixes if f.id == fid)


def test_fragmentation_cached_covers_request():
    d = diagnose(modern("7.50 GiB", "21.99 GiB", "6.62 GiB", "6.15 GiB", "8.71 GiB",
                        "Including non-PyTorch memory, this process has 15.35 GiB memory in use. "))
    assert d.verdict == "fragmentation"  # 8.71 GiB cached-unallocated >= 7.50 GiB, device free 6.62 GiB < request
    assert d.shortfall == round(7.50 * GiB) - round(6.62 * GiB)
    assert "8.71 GiB is cached" in d.reason


def test_fragmentation_and_derived_fixes():
    d = diagnose(modern("1.70 GiB", "6.00 GiB", "0 bytes", "2.93 GiB", "2.30 GiB"))
    assert d.verdict == "fragmentation"
    assert d.shortfall == round(1.70 * GiB)  # nothing free on the device: reduce by the whole request otherwise
    es = fix(d, "expandable_segments")
    assert es.works and es.conf == "expandable_segments:True"
    assert dict(es.env) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}  # 2.2-2.9 message: no generic var
    ms = fix(d, "max_split_size_mb")
    assert ms.works and ms.conf == f"max_split_size_mb:{round(1.70 * GiB) // MiB}" == "max_split_size_mb:1740"
    assert not fix(d, "empty_cache").works and not fix(d, "garbage_collection_threshold").works
    assert [f.works for f in d.fixes] == sorted((f.works for f in d.fixes), reverse=True)  # working fixes first
    assert any("2.30 GiB" in e for e in d.evidence)


def test_fragmentation_joined_with_free_memory():
    d = diagnose(legacy("1.41 GiB", "31.75 GiB", "28.72 GiB", "685.50 MiB", "30.02 GiB"))
    assert d.verdict == "fragmentation"
    assert "together cover" in d.reason
    assert d.shortfall == round(1.41 * GiB) - round(685.50 * MiB)


def test_small_request_max_split_does_not_apply_and_windows_blocks_expandable():
    d = diagnose(legacy("20.00 MiB", "4.00 GiB", "3.36 GiB", "0 bytes", "3.41 GiB"), platform="windows")
    assert d.verdict == "fragmentation"
    es, ms = fix(d, "expandable_segments"), fix(d, "max_split_size_mb")
    assert not es.works and "Windows" in es.why
    assert not ms.works and "21 MiB" in ms.why  # <= 2.0 message: the option must be > 20
    assert d.platform == "windows"


def test_shortage_and_reduce_percentage():
    d = diagnose(modern("1.96 GiB", "23.43 GiB", "210.06 MiB", "22.41 GiB", "206.09 MiB",
                        "Including non-PyTorch memory, this process has 23.20 GiB memory in use. "))
    assert d.verdict == "shortage"
    short = round(1.96 * GiB) - round(210.06 * MiB) - round(206.09 * MiB)
    assert d.shortfall == short
    red = d.fixes[0]
    assert red.id == "reduce_batch"
    pct = -(-100 * short // (round(22.41 * GiB) + round(1.96 * GiB)))
    assert dict(red.extra)["reduce_percent"] == pct == 7


def test_single_request_larger_than_device():
    d = diagnose("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 55.57 GiB. GPU 0 has a total capacty "
                 "of 12.00 GiB of which 9.02 GiB is free. Of the allocated memory 984.52 MiB is allocated by PyTorch, and "
                 "463.48 MiB is reserved by PyTorch but unallocated.")
    assert d.verdict == "shortage" and d.shortfall == round(55.57 * GiB) - 12 * GiB
    split = d.fixes[0]
    assert split.id == "split_operation" and dict(split.extra)["chunks"] == 5


def test_contention_names_the_pids():
    text = modern("2.60 GiB", "14.74 GiB", "2.44 GiB", "7.85 GiB", "86.90 MiB",
                  "Process 21197 has 366.00 MiB memory in use. Process 21200 has 3.40 GiB memory in use. "
                  "Including non-PyTorch memory, this process has 8.07 GiB memory in use. ")
    d = diagnose(text)
    assert d.verdict == "contention"
    f = fix(d, "free_other_processes")
    assert dict(f.extra)["pids"] == [21200]  # the largest alone covers the 76.94 MiB missing
    assert "PID 21200 (3.40 GiB)" in f.why


def test_probable_self_pid_is_not_contention():
    d = diagnose(modern("7.20 GiB", "11.91 GiB", "2.22 GiB", "9.44 GiB", "116.32 MiB",
                        "Process 11764 has 9.69 GiB memory in use. "))
    assert d.verdict == "shortage"
    assert any("probably this process" in e for e in d.evidence)


def test_cap_is_answered_within_it_shortage_when_live_tensors_exceed_it():
    # live 793.31 MiB + request 288 MiB = 1.06 GiB > the 1008.73 MiB limit: no setting fits it within the cap
    d = diagnose(legacy("288.00 MiB", "3.94 GiB", "793.31 MiB", "1.89 GiB", "936.00 MiB", "1008.73 MiB allowed; "))
    assert d.verdict == "shortage" and "cap" in d.contributing
    assert "within the per-process limit 1008.73 MiB" in d.reason and "no allocator setting helps" in d.reason
    assert d.shortfall == round(793.31 * MiB) + 288 * MiB - round(1008.73 * MiB)
    assert d.fixes[0].id == "reduce_batch"
    f = fix(d, "raise_memory_fraction")
    need = 936 * MiB + 288 * MiB
    frac = dict(f.extra)["fraction"]
    assert frac == 0.31 and frac * round(3.94 * GiB) >= need > (frac - 0.01) * round(3.94 * GiB)
    assert "set_per_process_memory_fraction(0.31)" in f.code
    assert not fix(d, "garbage_collection_threshold").works


def test_cap_is_answered_within_it_fragmentation_when_the_bytes_exist_in_it():
    # cached free 300 MiB >= 288 MiB request: fragmentation within the 1.50 GiB limit, the device had room
    d = diagnose(legacy("288.00 MiB", "3.94 GiB", "1.00 GiB", "1.89 GiB", "1.29 GiB", "1.50 GiB allowed; "))
    assert d.verdict == "fragmentation" and "cap" in d.contributing
    assert "within the per-process limit 1.50 GiB" in d.reason and "split into pieces" in d.reason
    assert any(e.startswith("not decided by the message") for e in d.evidence)
    assert {"expandable_segments", "max_split_size_mb", "raise_memory_fraction"} <= {f.id for f in d.fixes}
    # live 1.00 GiB + 288 MiB fit under 1.40 GiB, yet cached free (50 MiB) alone does not cover the request:
    # the bytes exist within the cap only as cached pieces plus headroom
    e = diagnose(legacy("288.00 MiB", "3.94 GiB", "1.00 GiB", "1.89 GiB", "1.20 GiB", "1.40 GiB allowed; "))
    assert e.verdict == "fragmentation" and "neither does alone" in e.reason


def test_room_on_device_is_unknown():
    d = diagnose(modern("98.00 MiB", "4.00 GiB", "2.86 GiB", "254.49 MiB", "97.51 MiB"))
    assert d.verdict == "unknown" and "2.86 GiB free" in d.reason


def test_mps_watermark_fix_and_cuda_knobs_blocked():
    d = diagnose("RuntimeError: MPS backend out of memory (MPS allocated: 5.56 GB, other allocations: 1.10 GB, max "
                 "allowed: 6.80 GB). Tried to allocate 768.00 MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0")
    assert d.verdict == "cap"
    w = fix(d, "mps_high_watermark")
    need = round(5.56 * GiB) + round(1.10 * GiB) + 768 * MiB
    ratio = dict(w.extra)["ratio"]
    assert 1.7 * need / round(6.80 * GiB) <= ratio < 1.7 * need / round(6.80 * GiB) + 0.01
    assert dict(w.env)["PYTORCH_MPS_HIGH_WATERMARK_RATIO"] == f"{dict(w.extra)['ratio']:.2f}"
    assert dict(w.extra)["ratio"] > 1.7
    assert not fix(d, "expandable_segments").works


def test_cudamallocasync_knobs_blocked():
    d = diagnose("Allocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated : 15.16 GiB\n"
                 "Requested : 512.00 KiB\nDevice limit : 15.99 GiB\nFree (according to CUDA): 0 bytes\n"
                 "PyTorch limit (set by user-supplied memory fraction)\n: 17179869184.00 GiB")
    assert d.report.backend == "cudaMallocAsync"
    assert not fix(d, "expandable_segments").works and "cudaMallocAsync" in fix(d, "expandable_segments").why
    assert not fix(d, "max_split_size_mb").works
    assert fix(d, "native_backend").works


def test_hip_old_rocm_expandable_not_supported_and_xpu_cap():
    d = diagnose("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 124.00 MiB. GPU 0 has a total capacity of "
                 "19.94 GiB of which 0 bytes is free. Of the allocated memory 15.87 GiB is allocated by PyTorch, and "
                 "165.29 MiB is reserved by PyTorch but unallocated.")
    es = fix(d, "expandable_segments")
    assert dict(es.env)["PYTORCH_HIP_ALLOC_CONF"] == "expandable_segments:True" and es.requires
    x = diagnose("XPU out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 15.11 GiB. Of the "
                 "allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated.")
    assert x.verdict == "cap"


def test_unknown_reasons():
    assert "no figures" in diagnose("RuntimeError: cuda runtime error (2) : out of memory at x/THCStorage.cu:58").reason
    assert "cut" in diagnose("torch.OutOfMemoryError: Allocation on device \n").reason


def test_api_last_message_dedupe_and_exceptions():
    a = modern("1.70 GiB", "6.00 GiB", "0 bytes", "2.93 GiB", "2.30 GiB")
    c = modern("98.00 MiB", "4.00 GiB", "2.86 GiB", "254.49 MiB", "97.51 MiB")
    text = a + "\nretrying\n" + a + "\n" + c
    all_ = diagnose_all(text)
    assert [d.verdict for d in all_] == ["fragmentation", "unknown"] and all_[0].occurrences == 2
    assert alloctune.diagnose(text).verdict == "unknown"  # the last one ended the run
    try:
        try:
            raise RuntimeError(a)
        except RuntimeError as inner:
            raise ValueError("wrapped") from inner
    except ValueError as exc:
        assert alloctune.diagnose(exc).verdict == "fragmentation"
    with pytest.raises(NoOOMFound):
        diagnose("   \n")
    with pytest.raises(NoOOMFound):
        diagnose("all good, no errors here")
    with pytest.raises(InputError):
        diagnose(a, platform="amiga")
    with pytest.raises(InputError):
        diagnose(42)


def test_diagnosis_round_trip():
    d = diagnose(modern("1.70 GiB", "6.00 GiB", "0 bytes", "2.93 GiB", "2.30 GiB"))
    data = json.loads(json.dumps(d.to_dict()))
    back = Diagnosis.from_dict(data)
    assert back.to_dict() == d.to_dict()


def test_core_does_not_import_torch():
    code = ("import sys, alloctune; from alloctune.diagnose import diagnose; import alloctune.config.shells; "
            "diagnose('CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 6.00 GiB total capacity; 4.88 GiB already "
            "allocated; 0 bytes free; 4.96 GiB reserved in total by PyTorch)'); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
