"""The in-process agent: runs inside the user's Python process, started by our `sitecustomize`.

Why a separate, self-contained module: it is loaded *by file path* in the child, which may
run another interpreter or venv than alloctune itself, so it imports only the standard
library at start-up and `torch` only once the program imports it. Nothing here runs per
allocation; the only ongoing work is one daemon thread that samples statistics once a second.

What it does, in order:

1. `activate(config)` (called by `sitecustomize`) installs a one-shot import hook for
   `torch`, an excepthook, a `sys.exit` recorder, a SIGTERM handler (only where the program
   has none) and an `atexit` writer. A process that never imports torch pays nothing more.
2. Once `torch` has been imported it queues `_on_cuda_init` with `torch.cuda._lazy_call`, so
   it runs exactly when CUDA is initialised (first CUDA op), never earlier: the budget is
   applied (`set_per_process_memory_fraction(budget / total_memory)`), allocator history is
   recorded if asked (`--record`: full history; `--on-oom snapshot`: a bounded ring dumped
   when an OOM happens), the OOM observer is attached, and the live sampler starts. A trial started
   ahead (`gate` set) is held at its first CUDA call until the runner releases it with its
   setting, budget and what to record (`gate.py`, `run/warm.py`).
3. At exit (normal, exception, OOM, `sys.exit`, SIGTERM) it writes `report.<pid>.json`
   (`report.rank<R>.<pid>.json` in a rank of a multi-process job)
   into the report directory (schema `REPORT_SCHEMA`, see `build_report`).

What it writes -- the report, the snapshots, the live samples `alloctune watch` reads -- is
`outputs.py`; the agent's settings (`settings.py`), the torch import hook (`torch_hook.py`)
and the runner watchdog (`watchdog.py`) are sibling files too, all loaded the same way (see
`_sibling`). This file keeps the hooks into the process and what they do at each moment.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
import signal
import sys
import threading
import time
from types import ModuleType
from typing import Any


def _sibling(name: str) -> ModuleType:
    """Load `agent/<name>.py`: from the package when this file was imported from it, else by path.

    Why by path: in the child this file itself is loaded by path (see `sitecustomize.py`),
    perhaps by an interpreter without alloctune, so `import alloctune...` cannot be relied on.
    """
    if __package__:
        return importlib.import_module(f"{__package__}.{name}")
    key = f"_alloctune_agent_{name}"
    if key not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[key]  # no half-loaded module for a later attempt to pick up
            raise
    return sys.modules[key]


_settings = _sibling("settings")
ENV_VAR, STATE_DIR_VAR, CONFIG_FILE = _settings.ENV_VAR, _settings.STATE_DIR_VAR, _settings.CONFIG_FILE
load_config, with_defaults, fraction_for = _settings.load_config, _settings.with_defaults, _settings.fraction_for
default_state_dir, _int_env = _settings.default_state_dir, _settings._int_env
_TorchImportHook = _sibling("torch_hook")._TorchImportHook
_watchdog = _sibling("watchdog")
_outputs = _sibling("outputs")
_gate = _sibling("gate")
EMPTY_CACHE_MARKS_KEY, RUN_RECORD_KEY = _outputs.EMPTY_CACHE_MARKS_KEY, _outputs.RUN_RECORD_KEY
REPORT_SCHEMA, LIVE_SCHEMA, STAT_KEYS = _outputs.REPORT_SCHEMA, _outputs.LIVE_SCHEMA, _outputs.STAT_KEYS
write_json_atomic, segment_sizes, _is_oom = _outputs.write_json_atomic, _outputs.segment_sizes, _outputs._is_oom

# Exit code the agent uses when it must stop the program before it runs (budget > card).
EXIT_BUDGET_TOO_LARGE = 86


class Agent(_outputs.AgentOutputs):
    """The state of one process's agent. One instance per process (see `activate`).

    What it writes (report, snapshots, live samples) comes from `outputs.AgentOutputs`."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.pid = os.getpid()
        self.started = time.time()
        self._t0 = time.monotonic()
        self.rank = _int_env("RANK")
        self.local_rank = _int_env("LOCAL_RANK")
        self.torch = None
        self.cuda_initialized = False
        self.device: int | None = None
        self.device_name: str | None = None
        self.total_memory: int | None = None
        self.fraction: float | None = None
        self.checkpointing_enabled: list[str] = []  # what `--checkpointing` switched on
        self.exception: dict[str, str] | None = None
        self.exit_code: int | None = None
        self.forced_outcome: str | None = None
        self.ooms: list[dict[str, int]] = []
        self.oom_snapshot: str | None = None
        self.agent_errors: list[str] = []
        self.empty_cache_calls: list[list[int]] | None = None  # [t0_us, t1_us] per call, when recording
        self.autograd_counts: dict[str, int] | None = None  # module calls with/without grad, backward calls
        self._written = False
        self._stop = threading.Event()
        self._live_thread: threading.Thread | None = None
        self._live_path: str | None = None
        self._lock = threading.Lock()
        self.watchdog = None  # a `watchdog.Watchdog` once installed under a runner
        self.released = False  # a process started ahead (`gate` set) has read its release file
        self._release_lock = threading.Lock()
        self._env_watch: Any = None  # a held process: its program's uses of the allocator's variables

    # ---- installation -------------------------------------------------------------------
    def install(self) -> None:
        if self.config.get("gate"):  # held: note the program's uses of the setting's variables from its start
            self._env_watch = _gate.watch_environment(list(self.config.get("gate_env") or ()))
        if "torch" in sys.modules:
            self._on_torch_import(sys.modules["torch"])
        else:
            sys.meta_path.insert(0, _TorchImportHook(self._on_torch_import))
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._orig_exit = sys.exit
        sys.exit = self._exit
        try:
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError):  # not the main thread / unsupported
            pass
        atexit.register(self.finish)
        self.watchdog = _watchdog.start(self.config)

    def _on_torch_import(self, torch) -> None:
        self.torch = torch
        if self.config.get("gate"):  # started ahead: what it records is known only at its release
            self._mark_empty_cache(torch)
            try:
                _gate.hold_cuda_init(torch, self._release)
            except Exception as exc:  # held at CUDA init instead (`_on_cuda_init`)
                self._note(f"cannot hold the first CUDA call: {exc}")
        elif self.config.get("record"):
            self._mark_empty_cache(torch)
            self._watch_autograd(torch)
        if self.config.get("no_grad"):
            try:
                torch.set_grad_enabled(False)  # grad mode is per thread: the program's main thread
            except Exception as exc:
                self._note(f"cannot switch autograd off: {exc}")
        if self.config.get("checkpointing"):
            try:
                _sibling("checkpointing").install(torch, self.checkpointing_enabled, self._note)
            except Exception as exc:
                self._note(f"cannot switch checkpointing on: {exc}")
        if self.config.get("cudnn_benchmark") is not None:
            try:  # the program may set it again itself: the report reads it back at the end
                torch.backends.cudnn.benchmark = bool(self.config["cudnn_benchmark"])
            except Exception as exc:
                self._note(f"cannot set cudnn.benchmark: {exc}")
        try:
            torch.cuda._lazy_call(self._on_cuda_init)
        except Exception as exc:  # a torch without _lazy_call: note it, never break the program
            self._note(f"cannot hook CUDA init: {exc}")

    def _watch_autograd(self, torch) -> None:
        """Count module calls made with and without autograd, and backward passes (#29.2).

        A program that never runs backward yet calls its modules with grad on keeps every
        activation alive for a backward that never comes; `torch.no_grad()` would free them.
        Only while recording: a global forward pre-hook costs each module call a Python call.
        """
        counts = {"module_calls_with_grad": 0, "module_calls_without_grad": 0, "backward_calls": 0}
        try:
            is_grad = torch.is_grad_enabled
            in_inference = getattr(torch, "is_inference_mode_enabled", lambda: False)

            def pre_hook(module, args):
                if is_grad() and not in_inference():
                    counts["module_calls_with_grad"] += 1
                else:
                    counts["module_calls_without_grad"] += 1

            torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
            for name in ("backward", "grad"):  # Tensor.backward calls torch.autograd.backward
                real = getattr(torch.autograd, name)

                def counted(*args, _real=real, **kwargs):
                    counts["backward_calls"] += 1
                    return _real(*args, **kwargs)

                counted.__doc__ = real.__doc__
                setattr(torch.autograd, name, counted)
            self.autograd_counts = counts
        except Exception as exc:
            self._note(f"cannot watch autograd: {exc}")

    def _mark_empty_cache(self, torch) -> None:
        """Wrap `torch.cuda.empty_cache` so a recording knows the program's calls exactly:
        one that releases nothing leaves no allocator event (trace/stream.py reads the marks)."""
        try:
            real = torch.cuda.memory.empty_cache
            calls: list[list[int]] = []

            def empty_cache() -> None:
                t0 = time.time_ns() // 1000  # the clock of the snapshot's time_us
                try:
                    real()
                finally:
                    calls.append([t0, time.time_ns() // 1000])

            empty_cache.__doc__ = real.__doc__
            torch.cuda.empty_cache = torch.cuda.memory.empty_cache = empty_cache
            self.empty_cache_calls = calls
        except Exception as exc:
            self._note(f"cannot mark empty_cache() calls: {exc}")

    def _note(self, message: str) -> None:
        self.agent_errors.append(message)

    # ---- a trial started ahead (agent/gate.py) -------------------------------------------
    def _release(self) -> None:
        """Wait for the runner's release file, then take its settings as if started with them."""
        with self._release_lock:  # not `_lock`: a SIGTERM while held must still write the report
            if self.released:
                return
            touched = self._env_watch.stop() if self._env_watch is not None else []
            if touched:  # the program chose with no setting in place: a cold start is the faithful run
                sys.stderr.write(
                    f"alloctune agent: the program read {', '.join(touched)} before CUDA; this run starts again cold\n"
                )
                sys.stderr.flush()
                os._exit(_gate.EXIT_READ_SETTING)
            release = _gate.wait_for_release(str(self.config["gate"]))
            self.config = with_defaults({**self.config, **release.get("agent", {})})
            _gate.apply_environment(release.get("env", {}))
            try:
                _gate.apply_allocator_setting(self.torch, self.config.get("conf"))
            except Exception as exc:  # the variable set above still reaches an allocator not yet made
                self._note(f"cannot apply the allocator setting at run time: {exc}")
            self.released = True

    # ---- at CUDA init ---------------------------------------------------------------------
    def _on_cuda_init(self) -> None:
        if self.config.get("gate"):
            self._release()  # where the first CUDA call bypassed the wrapped entry
        torch = self.torch
        cfg = self.config
        self.cuda_initialized = True
        count = torch.cuda.device_count()
        device = torch.cuda.current_device()
        if self.local_rank is not None and count:
            device = self.local_rank % count
        wanted = cfg.get("device")
        if wanted is not None:
            if 0 <= int(wanted) < count:
                device = int(wanted)
            else:  # never fail the program over it: measure the default device and say so
                self._note(f"device {wanted} is not visible ({count} devices); measured device {device}")
        self.device = device
        props = torch.cuda.get_device_properties(device)
        self.device_name = props.name
        self.total_memory = int(props.total_memory)
        budget = cfg.get("budget")
        if budget is not None and int(budget) > self.total_memory:
            self.forced_outcome = "budget-too-large"
            self.finish()
            sys.stderr.write(
                f"alloctune agent: budget {int(budget)} bytes exceeds the total memory of {self.device_name} "
                f"({self.total_memory} bytes); stopping\n"
            )
            sys.stderr.flush()
            os._exit(EXIT_BUDGET_TOO_LARGE)
        if budget is not None or cfg.get("ensure_cap"):
            self.fraction = fraction_for(
                int(budget if budget is not None else self.total_memory), self.total_memory, bool(cfg.get("ensure_cap"))
            )
            torch.cuda.set_per_process_memory_fraction(self.fraction, device)
        # Everything below only observes: a failure is noted in the report, never raised into
        # the program (an exception here would surface at the program's first CUDA call).
        try:
            entries = cfg["record_max_entries"] if cfg.get("record") else cfg["oom_max_entries"]
            if cfg.get("record") or cfg.get("on_oom") == "snapshot":
                self._record_history(int(entries), str(cfg.get("stacks") or "python"))
        except Exception as exc:
            self._note(f"cannot record allocator history: {type(exc).__name__}: {exc}")
        observer = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if observer is not None:
            try:
                observer(self._on_oom)
            except Exception as exc:
                self._note(f"cannot attach the OOM observer: {exc}")
        else:
            self._note("this torch has no OOM observer; OOMs are seen only through exceptions")
        if cfg.get("live", True):
            try:
                self._start_live()
            except Exception as exc:
                self._note(f"cannot start live samples: {exc}")

    def _record_history(self, max_entries: int, stacks: str) -> None:
        """Start the allocator's history; with stacks, each allocation keeps the frames that made it
        (context "alloc": frees need none, which halves the cost of "all")."""
        memory = self.torch.cuda.memory
        if stacks == "none":
            memory._record_memory_history(max_entries=max_entries, context=None, stacks="python")
        else:
            memory._record_memory_history(max_entries=max_entries, context="alloc", stacks="all" if stacks == "all" else "python")

    def _on_oom(self, device: int, alloc_size: int, limit: int, free: int) -> None:
        """Called by the allocator after its retries failed, just before it raises.

        Cheap on purpose (programs such as cuDNN's workspace fallback can OOM thousands of
        times and carry on): the history is dumped only at the first OOM and again when an
        OOM ends the program (see `_excepthook`).
        """
        try:
            self.ooms.append({"device": int(device), "alloc_size": int(alloc_size), "limit": int(limit), "free": int(free)})
            if self.config.get("on_oom") == "snapshot" and len(self.ooms) == 1:
                self._dump_oom_snapshot()
        except Exception as exc:  # never let the observer raise into the allocator
            self._note(f"OOM observer failed: {exc}")

    # ---- live samples ---------------------------------------------------------------------
    def _start_live(self) -> None:
        state_dir = self.config.get("state_dir") or default_state_dir()
        self._live_path = os.path.join(state_dir, f"live-{os.getpid()}.json")
        self._live_thread = threading.Thread(target=self._live_loop, name="alloctune-live", daemon=True)
        self._live_thread.start()

    # ---- exit paths -----------------------------------------------------------------------
    def _excepthook(self, exc_type, exc, tb) -> None:
        self.exception = {"type": exc_type.__name__, "message": str(exc)}
        self.exit_code = 1
        if _is_oom(exc_type.__name__, str(exc)) and self.config.get("on_oom") == "snapshot":
            # The traceback still holds the frames' tensors: this is the state at the failure.
            self._dump_oom_snapshot()
        self._prev_excepthook(exc_type, exc, tb)

    def _exit(self, code=None):
        if code is None:
            self.exit_code = 0
        elif isinstance(code, int):
            self.exit_code = code
        else:
            self.exit_code = 1
        return self._orig_exit(code)

    def _on_sigterm(self, signum, frame) -> None:
        self.forced_outcome = "terminated"
        self.exit_code = 128 + signum
        self.finish()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _record_path(self, record: str) -> str:
        """One file per process: `{pid}`/`{rank}` placeholders, or `.rankN` for a multi-rank job."""
        path = record.replace("{pid}", str(os.getpid())).replace("{rank}", str(self.rank or 0))
        world = _int_env("WORLD_SIZE") or 1
        if path == record and world > 1:
            stem, dot, ext = path.partition(".")
            path = f"{stem}.rank{self.rank or 0}{dot}{ext}"
        return path


_AGENT: Agent | None = None


def activate(config: dict[str, Any] | None = None) -> Agent | None:
    """Start the agent in this process (idempotent). `config` defaults to `$ALLOCTUNE_AGENT`."""
    global _AGENT
    if _AGENT is not None:
        return _AGENT
    if config is None:
        config = load_config(os.environ.get(ENV_VAR))
        if config is None:
            return None
    else:
        config = with_defaults(config)
    _AGENT = Agent(config)
    _AGENT.install()
    return _AGENT
