"""A tiny stand-in for `torch` with a CUDA allocator, so the agent's GPU path runs on a CPU box.

`install(dir)` writes a `torch` package into `dir`; put `dir` on the child's PYTHONPATH.
It has just the surface the agent uses (`cuda._lazy_call`, `set_per_process_memory_fraction`,
`memory_stats`, `memory._record_memory_history` / `_snapshot`, the OOM observer) and a toy
allocator: `torch.cuda.fake_alloc(n)` reserves n rounded up to 2 MiB, enforcing the cap the
agent set, and raises `torch.OutOfMemoryError` after notifying the observers, like the real one.

The allocator setting is read from PYTORCH_CUDA_ALLOC_CONF when reported, unless
`memory._set_allocator_settings` set one. Switches (environment): FAKE_TOTAL (device bytes), FAKE_NO_CUDA=1 (no device),
FAKE_IGNORE_CONF=1 (the allocator reports default settings whatever was asked).
`torch.empty(n, dtype=torch.uint8, device="cuda")` gives a tensor that frees its bytes when
deleted (a perfect allocator: reserved = live), enough to dry-run bench/frag_workload.py.
"""

from __future__ import annotations

from pathlib import Path

SOURCE = r'''
import os, sys, time, types

__version__ = "2.11.0+fake"
MiB = 1 << 20


class OutOfMemoryError(RuntimeError):
    pass


_C = types.ModuleType("torch._C")
cuda = types.ModuleType("torch.cuda")
memory = types.ModuleType("torch.cuda.memory")
cuda.memory = memory
sys.modules.update({"torch._C": _C, "torch.cuda": cuda, "torch.cuda.memory": memory})

TOTAL = int(os.environ.get("FAKE_TOTAL", str(8 << 30)))
_observers = []
_queued = []
S = {"init": False, "initializing": False, "cap": None, "reserved": 0, "allocated": 0,
     "peak_reserved": 0, "peak_allocated": 0, "segments": 0, "ooms": 0, "retries": 0,
     "history": None, "fraction_calls": [], "live": {}}

_C._cuda_attach_out_of_memory_observer = _observers.append


def _lazy_call(fn, **kw):
    if S["init"]:
        fn()
    else:
        _queued.append(fn)


def _lazy_init():
    if S["init"] or S["initializing"]:
        return
    if os.environ.get("FAKE_NO_CUDA"):
        raise AssertionError("Torch not compiled with CUDA enabled")
    S["initializing"] = True
    try:
        for fn in _queued:
            fn()
    finally:
        S["initializing"] = False
    S["init"] = True


class _Props:
    name = "Fake GPU"
    total_memory = TOTAL


def set_per_process_memory_fraction(fraction, device=None):
    cuda._lazy_init()  # through the module's attribute, as torch's C++ does
    S["fraction_calls"].append(fraction)
    S["cap"] = int(fraction * TOTAL) if fraction < 1.0 else None


def fake_alloc(nbytes):
    cuda._lazy_init()
    size = -(-nbytes // (2 * MiB)) * (2 * MiB)
    cap = S["cap"] if S["cap"] is not None else TOTAL
    if S["reserved"] + size > cap:
        S["ooms"] += 1
        S["retries"] += 1
        if S["history"] is not None:  # as the real allocator: the trace entry first, then the observers
            S["history"].append({"action": "oom", "addr": 0, "size": size, "stream": 0,
                                 "device_free": TOTAL - S["reserved"], "time_us": time.time_ns() // 1000})
        for ob in _observers:
            ob(0, size, cap, cap - S["reserved"])
        raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size // MiB}.00 MiB.")
    S["reserved"] += size
    S["allocated"] += nbytes
    S["segments"] += 1
    S["peak_reserved"] = max(S["peak_reserved"], S["reserved"])
    S["peak_allocated"] = max(S["peak_allocated"], S["allocated"])
    addr = S["segments"] << 40
    S["live"][addr] = (size, nbytes)
    if S["history"] is not None:
        now = time.time_ns() // 1000  # the snapshot's time_us: wall clock in µs
        S["history"].append({"action": "segment_alloc", "addr": addr, "size": size, "stream": 0, "time_us": now})
        S["history"].append({"action": "alloc", "addr": addr, "size": nbytes, "stream": 0, "time_us": now})
    return addr


def fake_free_all():
    S["allocated"] = 0


def memory_stats(device=None):
    return {
        "reserved_bytes.all.current": S["reserved"],
        "reserved_bytes.all.peak": S["peak_reserved"],
        "allocated_bytes.all.current": S["allocated"],
        "allocated_bytes.all.peak": S["peak_allocated"],
        "active_bytes.all.current": S["allocated"],
        "active_bytes.all.peak": S["peak_allocated"],
        "requested_bytes.all.current": S["allocated"],
        "requested_bytes.all.peak": S["peak_allocated"],
        "inactive_split_bytes.all.current": 0,
        "inactive_split_bytes.all.peak": 0,
        "segment.all.current": S["segments"],
        "segment.all.peak": S["segments"],
        "segment.all.allocated": S["segments"],
        "segment.all.freed": 0,
        "num_alloc_retries": S["retries"],
        "num_ooms": S["ooms"],
        "num_device_alloc": S["segments"],
        "num_device_free": 0,
        "num_sync_all_streams": 0,
        "max_split_size": -1,
    }


def _set_allocator_settings(conf):
    S["conf"] = conf


def _settings():
    conf = "" if os.environ.get("FAKE_IGNORE_CONF") else S.get("conf", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    pairs = dict(p.split(":", 1) for p in conf.split(",") if ":" in p)
    return {
        "PYTORCH_CUDA_ALLOC_CONF": conf,
        "max_split_size": int(pairs["max_split_size_mb"]) * MiB if "max_split_size_mb" in pairs else -1,
        "expandable_segments": pairs.get("expandable_segments") == "True",
        "garbage_collection_threshold": float(pairs.get("garbage_collection_threshold", 0.0)),
    }


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=0, **kw):
    cuda._lazy_init()
    S["history"] = []
    S["max_entries"] = max_entries
    S["history_args"] = [context, stacks]


def _snapshot():
    """One segment per live allocation, as the toy allocator makes them (a block of the whole segment)."""
    segments = [{"device": 0, "address": addr, "total_size": size, "allocated_size": size, "active_size": size,
                 "requested_size": nbytes, "stream": 0, "segment_type": "large", "is_expandable": False,
                 "blocks": [{"address": addr, "size": size, "requested_size": nbytes, "state": "active_allocated"}]}
                for addr, (size, nbytes) in sorted(S["live"].items())]
    return {"segments": segments, "device_traces": [list(S["history"] or [])], "allocator_settings": _settings()}


class device:
    def __init__(self, spec):
        self.type = str(spec).split(":")[0]


uint8 = "uint8"


class _Tensor:
    """`torch.empty(n, device="cuda")`: holds n bytes (reserved = live, rounded to 2 MiB) until deleted."""

    def __init__(self, n):
        self.addr = fake_alloc(n)
        self.n = n

    def fill_(self, value):
        return self

    add_ = fill_

    def __del__(self):
        size = -(-self.n // (2 * MiB)) * (2 * MiB)
        S["allocated"] -= self.n
        S["reserved"] -= size
        S["live"].pop(self.addr, None)
        if S["history"] is not None:
            for action, nbytes in (("free_requested", self.n), ("free_completed", self.n), ("segment_free", size)):
                S["history"].append({"action": action, "addr": self.addr, "size": nbytes, "stream": 0,
                                     "time_us": time.time_ns() // 1000})


def empty(n, dtype=None, device=None):
    return _Tensor(n)


def ones(n, dtype=None, device=None):
    return _Tensor(n)


cuda.synchronize = lambda device=None: None
cuda._lazy_call = _lazy_call
cuda._lazy_init = _lazy_init
cuda.is_available = lambda: not os.environ.get("FAKE_NO_CUDA")
cuda.device_count = lambda: 0 if os.environ.get("FAKE_NO_CUDA") else 1
cuda.current_device = lambda: 0
cuda.get_device_properties = lambda d=None: _Props()
cuda.set_per_process_memory_fraction = set_per_process_memory_fraction
cuda.memory_stats = memory_stats
cuda.fake_alloc = fake_alloc
cuda.fake_free_all = fake_free_all
cuda.fake_state = S
memory.empty_cache = lambda: None  # nothing is cached: a call releases nothing (and leaves no event)
cuda.empty_cache = memory.empty_cache
memory._record_memory_history = _record_memory_history
memory._set_allocator_settings = _set_allocator_settings
memory._snapshot = _snapshot

# Autograd's surface the agent watches: grad mode, a module whose call runs the global forward
# pre-hooks, and backward (Tensor.backward calls torch.autograd.backward, as torch's does).
_grad = {"on": True}
is_grad_enabled = lambda: _grad["on"]
is_inference_mode_enabled = lambda: False


def set_grad_enabled(mode):
    _grad["on"] = bool(mode)


class no_grad:
    def __enter__(self):
        self.prev = _grad["on"]
        _grad["on"] = False

    def __exit__(self, *exc):
        _grad["on"] = self.prev


# torch.backends.cudnn.benchmark, the flag the agent's cuDNN switch sets at import
backends = types.ModuleType("torch.backends")
backends.cudnn = types.ModuleType("torch.backends.cudnn")
backends.cudnn.benchmark = False

nn = types.ModuleType("torch.nn")
nn.modules = types.ModuleType("torch.nn.modules")
nn.modules.module = types.ModuleType("torch.nn.modules.module")
_pre_hooks = []
nn.modules.module.register_module_forward_pre_hook = _pre_hooks.append


class Module:
    def __call__(self, *args):
        for hook in list(_pre_hooks):
            hook(self, args)
        return self.forward(*args)


nn.Module = Module
autograd = types.ModuleType("torch.autograd")
autograd.backward = lambda tensors, *a, **k: None
autograd.grad = lambda outputs, inputs, *a, **k: None
_Tensor.backward = lambda self, *a, **k: autograd.backward(self, *a, **k)
sys.modules.update({"torch.nn": nn, "torch.nn.modules": nn.modules, "torch.nn.modules.module": nn.modules.module,
                    "torch.autograd": autograd})
'''


def install(directory: Path) -> Path:
    pkg = directory / "torch"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(SOURCE)
    return directory
