"""Knobs that will silently do nothing (or fail) where they are going to run.

PyTorch accepts many settings that have no effect in the situation at hand — a GC threshold
without a memory cap, native knobs under `backend:cudaMallocAsync`, `expandable_segments`
on Windows — and users then conclude "the setting did not help". These checks say so up
front. They return plain data; rendering is the CLI's job.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from alloctune.config.knobs import KNOB_BY_NAME
from alloctune.config.model import ENV_VARS, AllocatorConfig, parse_config, parse_detailed
from alloctune.config.versions import DEFAULT_TORCH, TorchVersion, format_version, parse_torch_version
from alloctune.errors import ConfigError, InputError
from alloctune.units import format_size

ERROR = "error"  # torch will refuse this at CUDA init
WARNING = "warning"  # accepted, but does nothing (or not what was meant)
INFO = "info"

# Where a program runs, as every command names it (`config check`, `diagnose`): wsl runs the Linux
# CUDA build (its checks are Linux's); macos has no CUDA, so no CUDA allocator setting applies there.
PLATFORMS = ("linux", "windows", "wsl", "macos")


@dataclass(frozen=True)
class ConfigWarning:
    """One finding: a stable `code` for programs, a `message` for people."""

    code: str
    severity: str
    message: str
    key: str | None = None

    def to_dict(self) -> dict:
        return {"code": self.code, "severity": self.severity, "message": self.message, "key": self.key}

    @classmethod
    def from_dict(cls, d: Mapping) -> "ConfigWarning":
        return cls(d["code"], d["severity"], d["message"], d.get("key"))


def _native_knobs_set(config: AllocatorConfig) -> list[str]:
    keys = [k for k, _ in config.items() if k != "backend"]
    return [k for k in keys if KNOB_BY_NAME[k].honoured_by == "native"]


def check(
    config: AllocatorConfig | str,
    torch: str | TorchVersion = DEFAULT_TORCH,
    *,
    platform: str = "linux",
    fraction: float | None = None,
    card: int | None = None,
    largest_segment: int | None = None,
    env_var: str | None = None,
) -> list[ConfigWarning]:
    """Findings for `config` run under torch `torch` on `platform`.

    `fraction`: a `set_per_process_memory_fraction` the program applies (None = none);
    `card`: device memory in bytes; `largest_segment`: the largest segment the workload can
    create (bytes), e.g. from a trace; `env_var`: the variable the setting is put in.
    A string is parsed first (malformed text raises `ConfigError`) and also checked for text
    PyTorch silently ignores.
    """
    version = parse_torch_version(torch)
    if platform not in PLATFORMS:
        raise InputError(f"unknown platform {platform!r}: choose one of {', '.join(PLATFORMS)}")
    out: list[ConfigWarning] = []
    if isinstance(config, str):
        config, found = _text_findings(config, version)
        out += found
    out += _release_findings(config, version)
    if env_var is not None:
        out += _env_var_findings(env_var, version)
    cap_fraction = _cap_fraction(config, fraction, version)
    out += _inert_findings(config, version, platform, cap_fraction)
    out += _max_split_findings(config, card, cap_fraction, largest_segment)
    return out


def _text_findings(text: str, version: TorchVersion) -> tuple[AllocatorConfig, list[ConfigWarning]]:
    """Parse `text` (malformed text raises `ConfigError`); what PyTorch ignores in it silently."""
    result = parse_detailed(text, version)
    out = [ConfigWarning(n.code, WARNING, n.message, n.key) for n in result.notes]
    for key, n in Counter(result.keys).items():
        if n > 1:
            out.append(
                ConfigWarning(
                    "repeated-key",
                    WARNING,
                    f"{key} is given {n} times; PyTorch uses the last one"
                    + (" (roundup lists accumulate)" if key == "roundup_power2_divisions" else ""),
                    key,
                )
            )
    return result.config, out


def _release_findings(config: AllocatorConfig, version: TorchVersion) -> list[ConfigWarning]:
    """Keys this release does not know, or values it refuses: PyTorch rejects the whole string at CUDA init."""
    v = format_version(version)
    out: list[ConfigWarning] = []
    unknown = [k for k, _ in config.items() if not KNOB_BY_NAME[k].known_in(version)]
    for key in unknown:
        knob = KNOB_BY_NAME[key]
        if key == "expandable_segments":
            out.append(
                ConfigWarning(
                    "expandable-unsupported",
                    ERROR,
                    f"expandable_segments needs torch 2.1 or newer; torch {v} rejects the whole setting",
                    key,
                )
            )
        else:
            out.append(
                ConfigWarning(
                    "unknown-key",
                    ERROR,
                    f"{key} is unknown to torch {v} (it exists in torch {knob.versions()}); "
                    "torch refuses the whole setting at CUDA init",
                    key,
                )
            )
    if not unknown:
        try:
            parse_config(config.format(), version)
        except ConfigError as exc:
            out.append(ConfigWarning("invalid-for-version", ERROR, str(exc), getattr(exc, "key", None)))
    return out


def _env_var_findings(env_var: str, version: TorchVersion) -> list[ConfigWarning]:
    """The variable the setting goes in: PYTORCH_ALLOC_CONF is read from 2.10 on only."""
    if env_var not in ENV_VARS:
        raise InputError(f"unknown variable {env_var!r}: use {' or '.join(ENV_VARS)}")
    if env_var == "PYTORCH_ALLOC_CONF" and version < (2, 10):
        return [
            ConfigWarning(
                "alloc-conf-ignored",
                WARNING,
                f"torch {format_version(version)} ignores PYTORCH_ALLOC_CONF (read from 2.10 on); set PYTORCH_CUDA_ALLOC_CONF",
            )
        ]
    return []


def _cap_fraction(config: AllocatorConfig, fraction: float | None, version: TorchVersion) -> float | None:
    """The per-process cap in effect: the program's own call wins over the knob (2.10+)."""
    if config.per_process_memory_fraction is not None and version >= (2, 10):
        return config.per_process_memory_fraction if fraction is None else fraction
    return fraction


def _inert_findings(
    config: AllocatorConfig, version: TorchVersion, platform: str, cap_fraction: float | None
) -> list[ConfigWarning]:
    """Knobs accepted but doing nothing here: native knobs under the async backend, GC without a cap
    (a memory cap is what GC measures against), a zero fraction, expandable segments on Windows, any
    setting on macOS."""
    out: list[ConfigWarning] = []
    native_set = _native_knobs_set(config)
    if config.backend == "cudaMallocAsync" and native_set:
        out.append(
            ConfigWarning(
                "inert-under-async",
                WARNING,
                f"backend:cudaMallocAsync ignores {', '.join(native_set)}: the CUDA driver does the caching",
            )
        )

    has_cap = cap_fraction is not None and (cap_fraction < 1.0 or version <= (2, 9))
    if config.garbage_collection_threshold > 0 and not has_cap and config.backend == "native":
        why = "set_per_process_memory_fraction(f) with f < 1" if version >= (2, 10) else "set_per_process_memory_fraction(f)"
        if version >= (2, 10):
            why += " or per_process_memory_fraction:F"
        out.append(
            ConfigWarning(
                "gc-without-cap",
                WARNING,
                "garbage_collection_threshold does nothing without a per-process memory cap "
                f"({why}); use empty_cache() or expandable_segments instead",
                "garbage_collection_threshold",
            )
        )

    if config.per_process_memory_fraction == 0.0:
        out.append(
            ConfigWarning(
                "fraction-zero",
                WARNING,
                "per_process_memory_fraction:0 makes every allocation fail",
                "per_process_memory_fraction",
            )
        )

    if config.expandable_segments and platform == "windows":
        out.append(
            ConfigWarning(
                "expandable-windows",
                WARNING,
                "expandable_segments is not supported on Windows: PyTorch warns "
                "'expandable_segments not supported on this platform' and keeps it off",
                "expandable_segments",
            )
        )
    if platform == "macos" and config.items():
        out.append(
            ConfigWarning(
                "no-cuda-macos",
                WARNING,
                "macOS has no CUDA: the CUDA caching allocator and this setting do nothing there "
                "(MPS has its own PYTORCH_MPS_* variables)",
            )
        )
    return out


def _max_split_findings(
    config: AllocatorConfig, card: int | None, cap_fraction: float | None, largest_segment: int | None
) -> list[ConfigWarning]:
    """`max_split_size_mb` no block can reach (the card, the cap, the workload's largest segment), and
    `max_non_split_rounding_mb` without it."""
    out: list[ConfigWarning] = []
    mss = config.max_split_size
    if mss is not None and config.backend == "native":
        limit, what = None, ""
        if card is not None:
            limit, what = card, f"the card's memory ({format_size(card)})"
            if cap_fraction is not None and cap_fraction < 1:
                limit, what = int(card * cap_fraction), f"the memory cap ({format_size(int(card * cap_fraction))})"
        if limit is not None and mss >= limit:
            out.append(
                ConfigWarning(
                    "max-split-above-card",
                    WARNING,
                    f"max_split_size_mb:{mss >> 20} is at or above {what}: no block can reach it, so it is a no-op",
                    "max_split_size_mb",
                )
            )
        elif largest_segment is not None and mss > largest_segment:
            out.append(
                ConfigWarning(
                    "max-split-no-op",
                    WARNING,
                    f"max_split_size_mb:{mss >> 20} is above every segment this workload makes "
                    f"(largest {format_size(largest_segment)}): it is a no-op; try a value below that",
                    "max_split_size_mb",
                )
            )
    if mss is None and config.max_non_split_rounding is not None and config.backend == "native":
        out.append(
            ConfigWarning(
                "nsr-without-max-split",
                WARNING,
                "max_non_split_rounding_mb only matters for blocks at or above max_split_size_mb, "
                "which is not set: it is a no-op",
                "max_non_split_rounding_mb",
            )
        )
    return out


def check_sweep_values(knobs: Mapping[str, Sequence[str]], torch: str | TorchVersion = DEFAULT_TORCH) -> None:
    """Refuse any knob value a sweep would try that `torch` rejects, before anything runs.

    `knobs`: canonical knob name -> values as typed (`{"garbage_collection_threshold": ("0.6", "1.5")}`,
    what `tune.candidates.parse_knobs` returns). Why up front: otherwise a bad value is found only
    after the baseline run, minutes into a sweep. Raises `ConfigError` naming the value.
    """
    version = parse_torch_version(torch)
    for knob, values in knobs.items():
        if knob not in KNOB_BY_NAME:
            raise InputError(f"--knobs: unknown knob {knob!r}")
        for value in values:
            try:
                parse_config(f"{knob}:{value}", version)
            except ConfigError as exc:
                raise ConfigError(f"--knobs {knob}={value}: {exc}") from None
