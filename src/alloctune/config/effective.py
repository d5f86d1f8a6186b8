"""What a setting means under one torch release: effective values, findings, the lines to set it.

Why here and not in the CLI: which knobs a release has (non-split rounding from 2.6, the
fraction knob from 2.10, large segments from 2.11, `throw_on_cudamalloc_oom` from 2.12) and
what an absent knob defaults to are allocator rules, needed by the Python API as much as by
`alloctune config check`, which only renders `check_setting`'s result.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from alloctune.config.checks import ConfigWarning, check
from alloctune.config.model import AllocatorConfig
from alloctune.config.versions import DEFAULT_TORCH, TorchVersion, format_version, parse_torch_version
from alloctune.errors import InputError
from alloctune.schema import schema_id


def effective_values(config: AllocatorConfig, version: TorchVersion) -> dict[str, Any]:
    """What the allocator of `version` uses for each allocation-relevant knob (bytes as ints)."""
    v = format_version(version)
    out: dict[str, Any] = {
        "backend": config.backend,
        "max_split_size": config.max_split_size,
        "garbage_collection_threshold": config.garbage_collection_threshold,
        "expandable_segments": config.expandable_segments,
        "roundup_power2_divisions": list(config.roundup_table(v)),
    }
    if version >= (2, 6):
        out["max_non_split_rounding"] = config.effective_max_non_split_rounding(version)
    if version >= (2, 10):
        out["per_process_memory_fraction"] = (
            1.0 if config.per_process_memory_fraction is None else config.per_process_memory_fraction
        )
    if version >= (2, 11):
        out["large_segment_size"] = config.effective_large_segment_size(version)
    if version >= (2, 12):
        out["throw_on_cudamalloc_oom"] = config.throw_on_cudamalloc_oom
    return out


def describe_roundup(table: list[int] | tuple[int, ...]) -> str:
    """Runs of the 16-bucket roundup table, one per line: `0–512MiB: off`, `512MiB–1GiB: 2`, ..."""
    if not any(table):
        return "off"

    def size(i: int) -> str:
        return f"{1 << i}MiB" if i < 10 else f"{1 << (i - 10)}GiB"

    runs, start = [], 0
    for i in range(1, len(table) + 1):
        if i == len(table) or table[i] != table[start]:
            lo = "0" if start == 0 else size(start)
            hi = "∞" if i == len(table) else size(i)
            runs.append(f"{lo}–{hi}: {table[start] or 'off'}")
            start = i
    return "\n".join(runs)


# Findings that mean "this platform ignores the knob" -> the `AllocatorConfig` field it concerns.
# Such a knob is left out of the lines to set: setting it would only print PyTorch's warning.
IGNORED_ON_PLATFORM = {"expandable-windows": "expandable_segments"}


def without_ignored(
    config: AllocatorConfig, warnings: tuple[ConfigWarning, ...] | list[ConfigWarning]
) -> tuple[AllocatorConfig, tuple[str, ...]]:
    """`config` with the knobs the platform ignores back at their defaults, and their names."""
    defaults = {f.name: f.default for f in fields(AllocatorConfig)}
    dropped = {IGNORED_ON_PLATFORM[w.code]: w.key for w in warnings if w.code in IGNORED_ON_PLATFORM}
    if not dropped:
        return config, ()
    kept = replace(config, **{name: defaults[name] for name in dropped})
    return kept, tuple(key or name for name, key in dropped.items())


@dataclass(frozen=True)
class SettingCheck:
    """The result of checking one setting for one release and platform (plain data)."""

    input: str
    torch: str
    platform: str
    config: AllocatorConfig
    normalized: AllocatorConfig
    effective: dict[str, Any]
    warnings: tuple[ConfigWarning, ...]
    env: dict[str, str]  # variable -> value to set ({} for the defaults)
    shells: dict[str, str]  # shell -> the lines that set `env`
    not_set: tuple[str, ...] = ()  # knobs left out of `env`: the platform ignores them

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": schema_id("config-check"),
            "input": self.input,
            "torch": self.torch,
            "platform": self.platform,
            "valid": True,
            "canonical": self.config.format(),
            "normalized": self.normalized.format(),
            "config": self.config.to_dict(),
            "effective": self.effective,
            "roundup_table": list(self.config.roundup_table(self.torch)),
            "warnings": [w.to_dict() for w in self.warnings],
            "env": self.env,
            "shell": self.shells,
            "not_set": list(self.not_set),
        }


def check_setting(
    setting: str,
    torch: str | TorchVersion = DEFAULT_TORCH,
    *,
    platform: str = "linux",
    fraction: float | None = None,
    card: int | str | None = None,
    largest_segment: int | str | None = None,
    env_var: str | None = None,
) -> SettingCheck:
    """Validate `setting` as `torch` would (malformed text raises `ConfigError`) and collect what
    a user needs: effective values, inert or failing knobs, and the variables to set.

    `fraction`: a `set_per_process_memory_fraction` the program applies; `card` and
    `largest_segment`: sizes (bytes, or text with a unit) that enable the size checks.
    """
    from alloctune.config import shells
    from alloctune.units import parse_user_size

    version = parse_torch_version(torch)
    if fraction is not None and not 0 <= fraction <= 1:
        raise InputError(f"--fraction must be between 0 and 1, got {fraction}")
    card_bytes = parse_user_size(card, "--card") if card is not None else None
    largest = parse_user_size(largest_segment, "--largest-segment") if largest_segment is not None else None
    config = AllocatorConfig.parse(setting, version)
    warnings = check(
        setting, version, platform=platform, fraction=fraction, card=card_bytes, largest_segment=largest, env_var=env_var
    )
    normalized = config.normalized()
    in_effect, not_set = without_ignored(config, warnings)  # what the allocator there really uses
    text = in_effect.normalized().format()
    env = shells.env_assignments(text, version) if text else {}
    return SettingCheck(
        input=setting,
        torch=format_version(version),
        platform=platform,
        config=config,
        normalized=normalized,
        effective=effective_values(in_effect, version),
        warnings=tuple(warnings),
        env=dict(env),
        shells=shells.render_all(env) if env else {},
        not_set=not_set,
    )
