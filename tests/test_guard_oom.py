"""OOM detection: by exception type and the exact library status token, nothing looser."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from alloctune.guard import is_oom, oom_kind, strip_traceback


@pytest.mark.parametrize(
    "exc,kind",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 ..."), "allocator"),
        (torch.cuda.OutOfMemoryError("Allocation on device 0 would exceed allowed memory. (out of memory)"), "allocator"),
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "cudnn"),
        (RuntimeError("/pytorch/aten/src/ATen/cudnn/Conv.cpp:95: CuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "cudnn"),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), "cublas"),
        (RuntimeError("CUDA error: HIPBLAS_STATUS_ALLOC_FAILED when calling `hipblasCreate(handle)`"), "cublas"),
        (RuntimeError("cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`. "),
         "cusolver"),
        (RuntimeError("cuFFT error: CUFFT_ALLOC_FAILED"), "cufft"),
        (torch.AcceleratorError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
         "cuda-runtime"),
        (RuntimeError("CUDA driver error: out of memory"), "cuda-driver"),
        (RuntimeError("cuda runtime error (2) : out of memory at /opt/conda/.../THCStorage.cu:58"), "cuda-runtime"),
        (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 2.00 GiB total capacity; ...)"),
         "allocator-legacy"),
        (RuntimeError("MPS backend out of memory (MPS allocated: 8.89 GB, other allocations: 172.98 MB)"),
         "allocator-legacy"),
    ],
)
def test_recognised(exc, kind):
    assert oom_kind(exc) == kind
    assert is_oom(exc)


@pytest.mark.parametrize(
    "exc",
    [
        None,
        ValueError("out of memory"),
        MemoryError("out of memory"),  # host RAM: halving a GPU chunk does not help
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4000000000 bytes."),
        RuntimeError("Expected all tensors to be on the same device, but found at least two devices"),
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input."),
        RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"),
        RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, ...)`"),
        RuntimeError("cuFFT error: CUFFT_INVALID_SIZE"),
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("worker died: the log said CUDA out of memory. Tried to allocate 2 GiB"),
        RuntimeError("my model ran out of memory"),
        KeyError("CUBLAS_STATUS_ALLOC_FAILED"),  # token but wrong type and no "CUDA error:" prefix
    ],
)
def test_not_recognised(exc):
    assert oom_kind(exc) is None
    assert not is_oom(exc)


def test_explicit_cause_is_followed_but_implicit_context_is_not():
    oom = torch.OutOfMemoryError("CUDA out of memory.")
    wrapped = ValueError("inference failed")
    wrapped.__cause__ = oom
    assert oom_kind(wrapped) == "allocator"

    during = ValueError("bad input while handling")
    during.__context__ = oom
    assert not is_oom(during)


def _corpus_runtime_messages(path):
    pattern = re.compile(r"(?:^|[^A-Za-z.])(RuntimeError): ?([^\n\"]*)")
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        for m in pattern.finditer(entry["text"]):
            yield entry["id"], m.group(2).replace("\\n", "\n")


def test_every_runtimeerror_message_in_the_real_corpus_is_recognised(oom_corpus):
    """Old torch / other backends raised plain RuntimeErrors: each one users posted must match."""
    found = list(_corpus_runtime_messages(oom_corpus))
    assert len(found) >= 25  # the corpus has 28 such messages; guards against a broken extractor
    missed = [(i, msg[:80]) for i, msg in found if not is_oom(RuntimeError(msg))]
    assert missed == []


def test_strip_traceback_clears_locals_of_the_failed_frames():
    import weakref

    refs = []

    def step():
        scratch = torch.empty(1000)
        refs.append(weakref.ref(scratch))
        raise torch.OutOfMemoryError("CUDA out of memory.")

    try:
        step()
    except torch.OutOfMemoryError as exc:
        kept = exc
    assert refs[0]() is not None  # the held exception's traceback keeps the tensor alive
    strip_traceback(kept)
    assert kept.__traceback__ is None
    assert refs[0]() is None
    assert str(kept) == "CUDA out of memory."


def test_guard_imports_and_detects_without_torch(tmp_path):
    """On a torch-less machine the package imports and torch-type checks return False."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # makes `import torch` fail like a missing install
        import alloctune.guard as g
        class OutOfMemoryError(RuntimeError):
            pass
        assert g.is_oom(OutOfMemoryError("CUDA out of memory.")) is True  # legacy text rule, no torch needed
        assert g.is_oom(OutOfMemoryError("something else")) is False
        assert g.is_oom(ValueError("CUDA out of memory.")) is False
        assert g.release_cached() == 0
        j = g.Janitor(stats_fn=lambda: {}, empty_cache=lambda: None)
        assert j.step().cleaned is False
        print("ok")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_importing_the_guard_does_not_import_torch():
    code = "import sys, alloctune.guard; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
