"""The text PyTorch would raise for a simulated OOM (`torch.OutOfMemoryError`), per release.

Everything the allocator knows is reproduced exactly (the would-be segment size, the cap,
allocated and reserved-but-unallocated bytes at the moment of failure). What it cannot know
is left to the caller: the driver's free-memory figure depends on other processes, and the
per-process NVML list (`proc_info`) is omitted unless given. Texts follow spec §7.
"""

from __future__ import annotations

from alloctune.sim.allocator import OOMInfo
from alloctune.sim.settings import parse_torch_version
from alloctune.units import format_size

_DOCS_OLD = "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables"
_DOCS_NEW = "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"


def oom_message(
    info: OOMInfo,
    *,
    total_memory: int,
    torch: str | tuple[int, int] | None = None,
    device: int = 0,
    proc_info: str = "",
    private_pool_bytes: int = 0,
) -> str:
    """`CUDA out of memory. Tried to allocate ...` as torch 2.2-2.14 words it."""
    ver = parse_torch_version(torch)
    allowed = f"{format_size(info.cap)} allowed; " if info.cap is not None else ""
    head = (
        f"CUDA out of memory. Tried to allocate {format_size(info.alloc_size)}. GPU {device} has a total capacity "
        f"of {format_size(total_memory)} of which {format_size(max(0, info.device_free))} is free. "
        f"{proc_info}{allowed}"
    )
    a, r, p = info.allocated, info.reserved, private_pool_bytes
    if ver < (2, 4):
        middle = (
            f"Of the allocated memory {format_size(a)} is allocated by PyTorch, and "
            f"{format_size(r - a)} is reserved by PyTorch but unallocated."
        )
    else:
        pools = f"with {format_size(p)} allocated in private pools (e.g., CUDA Graphs), " if p > 0 else ""
        middle = (
            f"Of the allocated memory {format_size(a + p)} is allocated by PyTorch, {pools}and "
            f"{format_size(r - a - p)} is reserved by PyTorch but unallocated."
        )
    var = "PYTORCH_ALLOC_CONF" if ver == (2, 10) else "PYTORCH_CUDA_ALLOC_CONF"
    docs = _DOCS_NEW if ver >= (2, 11) else _DOCS_OLD
    tail = (
        f" If reserved but unallocated memory is large try setting {var}=expandable_segments:True to avoid "
        f"fragmentation.  See documentation for Memory Management  ({docs})"
    )
    return head + middle + tail
