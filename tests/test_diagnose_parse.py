"""Parsing each message era into exact bytes, and finding messages inside noisy text."""

from __future__ import annotations

import json
from decimal import ROUND_HALF_EVEN, Decimal

import pytest

from alloctune.diagnose import find_reports

UNITS = {"bytes": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


def b(figure: str) -> int:
    """Independent reference conversion: '1.96 GiB' -> bytes (rounded half-even)."""
    num, unit = figure.split()
    return int((Decimal(num) * UNITS[unit]).to_integral_value(rounding=ROUND_HALF_EVEN))


def one(text: str, **kw):
    reps = find_reports(text, **kw)
    assert len(reps) == 1, reps
    return reps[0]


def test_thc_pre_1_0():
    r = one("RuntimeError: cuda runtime error (2) : out of memory at /opt/conda/work/torch/lib/THC/generic/THCStorage.cu:58\n")
    assert (r.format, r.vendor, r.torch_hint) == ("thc", "cuda", "<=0.4")
    assert r.location == "/opt/conda/work/torch/lib/THC/generic/THCStorage.cu:58"
    assert r.figures() == {}


def test_paren_cached_era():
    r = one("RuntimeError: CUDA out of memory. Tried to allocate 16.00 GiB (GPU 0; 11.93 GiB total capacity; "
            "4.00 GiB already allocated; 7.33 GiB free; 179.00 KiB cached)")
    assert r.format == "paren-cached"
    assert r.device == 0
    assert r.requested == 16 * 1024**3
    assert r.total == b("11.93 GiB")
    assert r.allocated == 4 * 1024**3
    assert r.free == b("7.33 GiB")
    assert r.reserved_unallocated == 179 * 1024  # "cached" = held but not used (pytorch#13751)
    assert r.reserved == 4 * 1024**3 + 179 * 1024
    assert r.derived == ("reserved",)


def test_paren_reserved_with_allowed_and_hint():
    r = one("RuntimeError: CUDA out of memory. Tried to allocate 288.00 MiB (GPU 0; 3.94 GiB total capacity; "
            "793.31 MiB already allocated; 1.89 GiB free; 1008.73 MiB allowed; 936.00 MiB reserved in total by "
            "PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
            "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")
    assert (r.format, r.torch_hint, r.hint) == ("paren-hint", "1.10-2.0", "max_split_size_mb")
    assert r.cap == b("1008.73 MiB")
    assert r.reserved == 936 * 1024**2
    assert r.reserved_unallocated == 936 * 1024**2 - b("793.31 MiB")
    assert r.derived == ("reserved_unallocated",)
    assert not r.truncated


def test_2_1_capacty_with_processes():
    r = one("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 138.00 MiB. GPU 0 has a total "
            "capacty of 15.90 GiB of which 8.44 MiB is free. Process 1246069 has 577.00 MiB memory in use. "
            "Including non-PyTorch memory, this process has 15.32 GiB memory in use. Of the allocated memory "
            "14.12 GiB is allocated by PyTorch, and 410.41 MiB is reserved by PyTorch but unallocated. If reserved "
            "but unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  See "
            "documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")
    assert (r.format, r.torch_hint) == ("2.1", "2.1")
    assert r.other_processes == ((1246069, 577 * 1024**2),)
    assert r.process_in_use == b("15.32 GiB")
    assert r.allocated == b("14.12 GiB")
    assert r.reserved_unallocated == b("410.41 MiB")
    assert r.reserved == b("14.12 GiB") + b("410.41 MiB")


def test_2_4_private_pools():
    r = one("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 72.00 MiB. GPU 0 has a total capacity "
            "of 31.33 GiB of which 2.56 MiB is free. Including non-PyTorch memory, this process has 31.28 GiB memory "
            "in use. Of the allocated memory 29.83 GiB is allocated by PyTorch, with 18.00 MiB allocated in private "
            "pools (e.g., CUDA Graphs), and 711.09 MiB is reserved by PyTorch but unallocated. If reserved but "
            "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
            "fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/"
            "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")
    assert r.torch_hint == ">=2.11"
    assert r.private_pools == 18 * 1024**2
    assert r.docs_url.startswith("https://docs.pytorch.org/")
    assert r.hint == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


def test_2_11_verbatim_and_cap():
    r = one("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 139.80 GiB of which "
            "138.99 GiB is free. Including non-PyTorch memory, this process has 608.00 MiB memory in use. 100.00 MiB "
            "allowed; Of the allocated memory 90.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch "
            "but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
            "Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")
    assert r.format == "2.2+"  # "allowed" alone does not make it a legacy message
    assert r.cap == 100 * 1024**2
    assert r.total == b("139.80 GiB")
    assert r.reserved_unallocated == 0
    assert r.reserved == 90 * 1024**2


def test_2_10_generic_variable_hint():
    r = one("CUDA out of memory. Tried to allocate 2.60 GiB. GPU 0 has a total capacity of 14.74 GiB of which 2.44 "
            "GiB is free. Of the allocated memory 7.85 GiB is allocated by PyTorch, and 86.90 MiB is reserved by "
            "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
    assert r.torch_hint == "2.10"


def test_hip_and_npu_and_xpu():
    hip = one("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 124.00 MiB. GPU 0 has a total capacity of "
              "19.94 GiB of which 554.47 MiB is free. Of the allocated memory 15.87 GiB is allocated by PyTorch, and "
              "165.29 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
              "setting PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
    assert (hip.vendor, hip.hint) == ("hip", "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True")
    npu = one("RuntimeError: NPU out of memory. Tried to allocate 5.03 GiB (NPU 3; 60.96 GiB total capacity; 49.47 GiB "
              "already allocated; 49.47 GiB current active; 1.32 GiB free; 57.55 GiB reserved in total by PyTorch)")
    assert (npu.vendor, npu.device, npu.format) == ("npu", 3, "npu-paren")
    assert npu.active == b("49.47 GiB") and npu.reserved == b("57.55 GiB")
    xpu = one("XPU out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 15.11 GiB. Of the "
              "allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. "
              "Please use `empty_cache` to release all unoccupied cached memory.")
    assert (xpu.vendor, xpu.format, xpu.free, xpu.allocated, xpu.truncated) == ("xpu", "xpu", None, 0, False)


def test_mps():
    r = one("RuntimeError: MPS backend out of memory (MPS allocated: 18.02 GB, other allocations: 107.10 MB, max "
            "allowed: 18.13 GB). Tried to allocate 4.50 MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 "
            "to disable upper limit for memory allocations (may cause system failure).")
    assert (r.vendor, r.format, r.platform, r.request_pool) == ("mps", "mps", "macos", "private")
    assert r.allocated == b("18.02 GB") and r.other_allocations == b("107.10 MB") and r.cap == b("18.13 GB")
    assert r.requested == b("4.50 MB")


def test_cudamallocasync_full_and_truncated():
    text = ("torch.cuda.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)\n"
            "Currently allocated     : 6.89 GiB\nRequested               : 320.00 MiB\n"
            "Device limit            : 23.69 GiB\nFree (according to CUDA): 2.94 MiB\n"
            "PyTorch limit (set by user-supplied memory fraction)\n                        : 17179869184.00 GiB\n"
            "2024-06-22 15:13:25,079- root:124- INFO- Prompt executed in 57.84 seconds\n")
    r = one(text)
    assert (r.backend, r.format, r.device, r.truncated) == ("cudaMallocAsync", "cudamallocasync", 0, False)
    assert r.cap == b("17179869184.00 GiB")  # SIZE_MAX: no limit
    assert r.free == b("2.94 MiB") and r.total == b("23.69 GiB") and r.requested == 320 * 1024**2
    assert "Prompt executed" not in r.raw
    cut = one("- **Exception Type:** torch.OutOfMemoryError\n- **Exception Message:** Allocation on device \n## Stack Trace\n")
    assert (cut.backend, cut.truncated, cut.figures()) == ("cudaMallocAsync", True, {})


def test_preemptive_and_1eb():
    r = one("torch.OutOfMemoryError: CUDA out of memory. Allocation was preemptively rejected because it would exceed "
            "per_process_memory_fraction limit. Requested size: 5.00 MiB")
    assert (r.format, r.requested, r.torch_hint) == ("preemptive", 5 * 1024**2, ">=2.12")
    r = one("RuntimeError: CUDA out of memory. Tried to allocate more than 1EB memory.")
    assert r.format == "1eb"


# ---- finding messages in noise ---------------------------------------------------------------

MODERN = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 5 has a total capacity of 23.43 GiB "
          "of which 210.06 MiB is free. Of the allocated memory 22.41 GiB is allocated by PyTorch, and 206.09 MiB is "
          "reserved by PyTorch but unallocated.")


def test_crlf_and_rank_prefix_on_wrapped_lines():
    text = ("[rank0]: Traceback (most recent call last):\r\n"
            "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 5 has a total\r\n"
            "[rank0]: capacity of 23.43 GiB of which 210.06 MiB is free. Of the allocated memory 22.41 GiB is\r\n"
            "[rank0]: allocated by PyTorch, and 206.09 MiB is reserved by PyTorch but unallocated.\r\n"
            "[rank0]: next line\r\n")
    r = one(text)
    assert r.device == 5 and r.reserved_unallocated == b("206.09 MiB")
    assert text[r.span[0]:r.span[1]] == r.raw
    assert r.raw.startswith("CUDA out of memory.") and r.raw.endswith("unallocated.")


def test_vllm_prefix_json_escaped_and_html():
    vllm = "\n".join(f"(EngineCore pid=229) ERROR 04-19 12:21:04 [core.py:1134] {part}"
                     for part in ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 5 has",
                                  "a total capacity of 23.43 GiB of which 210.06 MiB is free."))
    assert one(vllm).free == b("210.06 MiB")
    body = json.dumps({"error": MODERN.replace(". GPU", ".\nGPU").replace("is free.", 'is "free".')})
    r = one(body)
    assert r.total == b("23.43 GiB") and r.requested == b("1.96 GiB")
    html = "<td>" + MODERN.replace("unallocated.", "unallocated. If reserved memory is &gt;&gt; allocated memory try "
                                   "setting max_split_size_mb to avoid fragmentation.") + "</td>"
    r = one(html)
    assert r.hint == "max_split_size_mb" and "</td>" not in r.raw


def test_rewrapped_fullwidth_and_several():
    text = ("报错：CUDA out of memory. Tried to allocate 22.00MiB(GPU 0；5.81 GiB total capacity；4.59GiB already allocated; "
            "13.50MiB free; 4.62GiB reserved in total by PyTorch)\n\n"
            "Tried to allocate 418.00 MiB\n (GPU 0; 6.00 GiB total capacity; \n 3.01 GiB already allocated;\n"
            " 363.12 MiB free; \n 3.82 GiB reserved in total by PyTorch) If reserved memory is >>\n"
            "allocated memory try setting max_split_size_mb to avoid fragmentation.\n")
    a, c = find_reports(text)
    assert (a.requested, a.allocated, a.reserved) == (22 * 1024**2, b("4.59 GiB"), b("4.62 GiB"))
    assert (c.requested, c.free, c.reserved, c.hint) == (418 * 1024**2, b("363.12 MiB"), b("3.82 GiB"), "max_split_size_mb")


def test_prose_is_not_a_message_and_truncation():
    assert find_reports("I meet CUDA out of memory when I run the test code. Tried to allocate nothing.") == []
    r = one("Result:\n\n```\nOutOfMemoryError: CUDA out of memory. Tried to allocate 3725.29 GiB. GPU\n```\n")
    assert r.truncated and r.requested == b("3725.29 GiB") and r.total is None


@pytest.mark.parametrize("hint_text,plat", [
    ('File "C:\\Users\\me\\ComfyUI\\execution.py", line 1', "windows"),
    ("(bab) root@DESKTOP:/mnt/c/Users/oo/chat#", "wsl"),
    ('File "/home/u/.venv/lib/python3.10/site-packages/torch/nn/x.py"', "linux"),
])
def test_platform_hints(hint_text, plat):
    r = one(hint_text + "\n" + MODERN)
    assert r.platform == plat
    assert one(hint_text + "\n" + MODERN, platform="linux").platform == "linux"


def test_report_round_trip():
    r = one(MODERN)
    from alloctune.diagnose import OOMReport

    d = r.to_dict()
    assert d["schema"] == "alloctune.oom-report/1"
    assert OOMReport.from_dict(json.loads(json.dumps(d))) == r


def test_platform_index_gives_the_hint_of_every_window():
    """The index (one pass for any clue, then the clues of each platform) answers exactly what
    scanning each message's window answers: clues scattered, overlapping ("/home/mnt/c/"), none at
    all, at the window's edges."""
    import random

    from alloctune.diagnose.platform import PlatformIndex, platform_hint

    rnd = random.Random(12)
    clues = ["/home/mnt/c/", "C:\\Users\\me\\x\\", "WSL2", "Windows 10", "/Users/a/", "/opt/homebrew/", "Ubuntu",
             "dist-packages/", "nvcuda.dll", "app.exe ", "MacBook", "/usr/lib/python", "Linux", "Win11", "WIN10"]
    filler = "x" * 997 + "\n"
    for _ in range(20):
        text = "".join(rnd.choice(clues) if rnd.random() < 0.05 else filler for _ in range(rnd.randrange(1, 60)))
        index = PlatformIndex(text)
        for s in range(0, len(text), 331):
            e = min(len(text), s + rnd.randrange(1, 800))
            assert platform_hint(text, s, e, "cuda", index) == platform_hint(text, s, e, "cuda"), (s, e)
    assert PlatformIndex(filler * 50).tables == []
