"""Recognise an out-of-memory failure by its type and its library status token.

Why so strict: a guard that retries on anything mentioning "out of memory" would also retry
host-RAM errors, data-loader failures and user exceptions, hiding real bugs behind a loop of
`empty_cache()` calls. So an exception counts as an OOM only when

* it is `torch.OutOfMemoryError` (alias `torch.cuda.OutOfMemoryError`, raised by the caching
  allocator for CUDA, HIP and XPU), or
* it is a `RuntimeError` (which includes `torch.AcceleratorError` and the Python face of
  `c10::CuDNNError`) whose message carries the exact status text a CUDA library uses for a
  failed allocation, in the form PyTorch's check macros print it:

  ===============================================  ========================================
  source (PyTorch check macro)                     text
  ===============================================  ========================================
  cuDNN (`AT_CUDNN_CHECK`, old `CUDNN_CHECK`)      ``cuDNN error: CUDNN_STATUS_ALLOC_FAILED``
  cuBLAS (`TORCH_CUDABLAS_CHECK`)                  ``CUDA error: CUBLAS_STATUS_ALLOC_FAILED``
  cuSOLVER (`TORCH_CUSOLVER_CHECK`)                ``cusolver error: CUSOLVER_STATUS_ALLOC_FAILED``
  cuFFT (`CUFFT_CHECK`)                            ``cuFFT error: CUFFT_ALLOC_FAILED``
  CUDA runtime (`C10_CUDA_CHECK`)                  ``CUDA error: out of memory`` (cudaErrorMemoryAllocation)
  CUDA runtime, torch <= 0.4                       ``cuda runtime error (2) : out of memory``
  CUDA driver (`AT_CUDA_DRIVER_CHECK`)             ``CUDA driver error: out of memory``
  caching allocators that raised RuntimeError      message *starting* ``CUDA out of memory.``, ``HIP ...``,
  (CUDA/HIP < 1.13, older XPU and MPS, torch_npu)  ``XPU ...``, ``NPU out of memory.``, ``MPS backend out of memory (``
  ===============================================  ========================================

The message rules were checked against the formats in PyTorch's check macros and against
every `RuntimeError` OOM message in the project's corpus of 98 real posts
(`tests/test_guard_oom.py`).

An exception raised explicitly *from* an OOM (``raise Wrapper(...) from oom``) also counts:
the explicit ``__cause__`` chain is followed. The implicit ``__context__`` is not: an error
raised while handling an OOM is a different failure.

torch is never imported here: when torch is not loaded, no exception can be a torch OOM, so
detection works (and returns False for torch errors) on machines without torch.
"""

from __future__ import annotations

import re
import sys
import traceback

__all__ = ["is_oom", "oom_kind", "strip_traceback"]

# Each rule: (kind, pattern searched in the message). The token is anchored to the prefix the
# PyTorch macro writes, so a user message quoting "out of memory" does not match.
_TOKEN_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("cudnn", re.compile(r"\b(?i:cudnn) error: CUDNN_STATUS_ALLOC_FAILED\b")),
    ("cublas", re.compile(r"\bCUDA error: (?:CU|HIP)BLAS_STATUS_ALLOC_FAILED\b")),  # HIP: hipBLAS
    ("cusolver", re.compile(r"\bcusolver error: CUSOLVER_STATUS_ALLOC_FAILED\b")),
    ("cufft", re.compile(r"\bcuFFT error: CUFFT_ALLOC_FAILED\b")),
    # cudaErrorMemoryAllocation; old ATen prefixed "file:line: ".
    ("cuda-runtime", re.compile(r"^(?:\S+:\d+: )?CUDA error: out of memory\b")),
    ("cuda-runtime", re.compile(r"^cuda runtime error \(2\) : out of memory\b")),  # torch <= 0.4
    ("cuda-driver", re.compile(r"^CUDA driver error: out of memory\b")),
    # Caching allocators that raised a plain RuntimeError: CUDA/HIP before torch 1.13, XPU
    # and MPS in older releases, Ascend's torch_npu. Anchored at the start of the message.
    ("allocator-legacy", re.compile(r"^(?:CUDA|HIP|XPU|NPU) out of memory\.(?: |$)")),
    ("allocator-legacy", re.compile(r"^MPS backend out of memory \(")),
)

_MAX_CHAIN = 8  # guards against cycles in a hand-built __cause__ chain


def _torch_oom_type() -> type | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return getattr(torch, "OutOfMemoryError", None) or getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)


def _own_kind(exc: BaseException) -> str | None:
    oom_type = _torch_oom_type()
    if oom_type is not None and isinstance(exc, oom_type):
        return "allocator"
    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc).lstrip()
    for kind, pattern in _TOKEN_RULES:
        if pattern.search(text):
            return kind
    return None


def oom_kind(exc: BaseException | None) -> str | None:
    """Which kind of allocation failure `exc` is (`"allocator"`, `"cudnn"`, `"cublas"`, ...), or None."""
    seen = 0
    while exc is not None and seen < _MAX_CHAIN:
        kind = _own_kind(exc)
        if kind is not None:
            return kind
        exc = exc.__cause__
        seen += 1
    return None


def is_oom(exc: BaseException | None) -> bool:
    """True when `exc` is a GPU out-of-memory / allocation failure (see the module docstring)."""
    return oom_kind(exc) is not None


def strip_traceback(exc: BaseException) -> None:
    """Drop everything `exc` keeps alive from the failed attempt, so its tensors can be freed.

    A traceback references the frames of the call that failed, and those frames reference
    every local tensor of the failed step (activations, the half-built output). Clearing the
    frames' locals and cutting the traceback (also on the chained exceptions) releases them;
    the exception object itself stays usable for logging and the `on_oom` hook.
    """
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        if tb is not None:
            traceback.clear_frames(tb)  # skips frames still executing (ours)
            e.__traceback__ = None
        for nxt in (e.__cause__, e.__context__):
            if nxt is not None:
                todo.append(nxt)
