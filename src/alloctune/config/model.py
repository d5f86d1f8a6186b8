"""`AllocatorConfig`: one allocator setting string as a frozen value.

The value is version-free (the same object describes the setting for any torch release);
version-specific things — which keys a release accepts, its limits, the meaning of `>` in a
roundup list, the default non-split rounding — are arguments of the methods that depend on
them. Two configs that PyTorch treats identically as an environment variable compare equal
after `normalized()`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from alloctune.config.knobs import (
    BOOL,
    CANONICAL_ORDER,
    INT,
    KNOB_BY_SPELLING,
    KNOBS,
    OTHER_DEFAULTS,
    TYPED_KNOBS,
)
from alloctune.config.parse import Note, read_text
from alloctune.config.values import (  # noqa: F401 (their public home stays `config.model` too)
    BACKENDS,
    ENV_VARS,
    LARGE_BUFFER,
    MAX_MB,
    N_INTERVALS,
    Roundup,
    RoundupItem,
    _is_pow2,
    apply_roundup,
    roundup_table_of,
    setting_from_table,
)
from alloctune.config.versions import DEFAULT_TORCH, TorchVersion, format_version, parse_torch_version
from alloctune.errors import ConfigError
from alloctune.schema import schema_id
from alloctune.units import MiB

SCHEMA = schema_id("allocator-config")
_OLD_SCHEMAS = (1,)  # written before the shared `alloctune.<kind>/<n>` form; same fields


def _canonical_roundup(value: Any) -> Roundup:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError("roundup_power2_divisions must be a power of 2 or a list of [MB, divisions] items")
    if isinstance(value, int):
        if not _is_pow2(value):
            raise ConfigError(f"roundup_power2_divisions:{value}: the divisions must be a power of 2")
        return value
    items: list[RoundupItem] = []
    for item in value:
        try:
            key, div = item
        except (TypeError, ValueError):
            raise ConfigError(f"roundup_power2_divisions item {item!r}: expected (MB or '>', divisions)") from None
        key = str(key).strip()
        if key != ">":
            if not key.isdigit() or not _is_pow2(int(key)):
                raise ConfigError(f"roundup_power2_divisions interval {key!r} must be a power of 2 (MB) or '>'")
            key = str(int(key))
        if isinstance(div, bool) or not isinstance(div, int) or not (div == 0 or _is_pow2(div)):
            raise ConfigError(f"roundup_power2_divisions {key}:{div!r}: divisions must be a power of 2 or 0")
        items.append((key, div))
    return tuple(items)


def _canonical_other(value: Any) -> tuple[tuple[str, str], ...]:
    pairs = value.items() if isinstance(value, Mapping) else value
    out: dict[str, str] = {}
    for key, text in pairs:
        knob = KNOB_BY_SPELLING.get(key)
        if knob is None or knob.name in TYPED_KNOBS:
            raise ConfigError(f"{key!r} is not an allocator knob without its own field")
        text = str(text)
        if knob.kind == BOOL:
            if text not in ("True", "False"):
                raise ConfigError(f"{knob.name} must be True or False, got {text!r}")
        elif knob.kind == INT:
            if not text.isdigit():
                raise ConfigError(f"{knob.name} must be a whole number, got {text!r}")
            text = str(int(text))
        out[knob.name] = text
    return tuple(sorted(out.items(), key=lambda kv: CANONICAL_ORDER[kv[0]]))


def _format_float(x: float) -> str:
    # repr() is the shortest text that reads back to the same double, in Python and in C's strtod.
    return repr(float(x))


@dataclass(frozen=True)
class AllocatorConfig:
    """The caching allocator's settings, as `PYTORCH_CUDA_ALLOC_CONF` expresses them.

    Bytes are ints. `None` means "not set" (the release's default). Knobs that cannot change
    where memory goes (pinned host memory, locking) live in `other` as canonical text, so
    they are validated, kept and written back but never reach the simulator.
    """

    backend: str = "native"
    max_split_size: int | None = None  # bytes; None = unlimited
    max_non_split_rounding: int | None = None  # bytes; None = the release's default
    garbage_collection_threshold: float = 0.0  # 0.0 = off
    expandable_segments: bool = False
    large_segment_size: int | None = None  # bytes (2.11+); None = 20 MiB
    per_process_memory_fraction: float | None = None  # 2.10+
    roundup_power2_divisions: Roundup = None  # single N, list items as given, or None
    other: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        for name in ("max_split_size", "max_non_split_rounding", "large_segment_size"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % MiB:
                raise ConfigError(f"{name} must be a positive whole number of MiB in bytes, got {value!r}")
            if value // MiB > MAX_MB:
                raise ConfigError(f"{name} is larger than PyTorch can store ({MAX_MB} MB)")
        gc = self.garbage_collection_threshold
        if isinstance(gc, bool) or not isinstance(gc, (int, float)) or not (gc == 0 or 0 < gc < 1):
            raise ConfigError(f"garbage_collection_threshold must be 0 (off) or in (0, 1), got {gc!r}")
        object.__setattr__(self, "garbage_collection_threshold", float(gc))
        frac = self.per_process_memory_fraction
        if frac is not None:
            if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not (0 <= frac <= 1):
                raise ConfigError(f"per_process_memory_fraction must be in [0, 1], got {frac!r}")
            object.__setattr__(self, "per_process_memory_fraction", float(frac))
        if not isinstance(self.expandable_segments, bool):
            raise ConfigError(f"expandable_segments must be a bool, got {self.expandable_segments!r}")
        object.__setattr__(self, "roundup_power2_divisions", _canonical_roundup(self.roundup_power2_divisions))
        object.__setattr__(self, "other", _canonical_other(self.other))

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str | None, torch: str | TorchVersion = DEFAULT_TORCH) -> "AllocatorConfig":
        """Read a setting string with the grammar, limits and messages of torch `torch`.

        Raises `ConfigError` (one line naming the problem, quoting PyTorch's own message)
        for anything that release would reject. `""`/None is the default config.
        """
        return parse_config(text, torch)

    @classmethod
    def from_allocator_settings(cls, settings: Mapping[str, Any], torch: str | TorchVersion = DEFAULT_TORCH) -> "AllocatorConfig":
        """The config a recorded run really used, from a snapshot's `allocator_settings`."""
        return config_from_allocator_settings(settings, torch)

    # ---- version-dependent views ----------------------------------------------------------

    def roundup_table(self, torch: str = DEFAULT_TORCH) -> tuple[int, ...]:
        """PyTorch's 16-entry divisions table (bucket i = sizes in [2^i, 2^(i+1)) MiB)."""
        return roundup_table_of(self.roundup_power2_divisions, torch)

    def effective_large_segment_size(self, torch: str | TorchVersion = DEFAULT_TORCH) -> int:
        """Segment size for 1–10 MiB requests: `large_segment_size_mb` exists from 2.11 only."""
        if parse_torch_version(torch) >= (2, 11) and self.large_segment_size is not None:
            return self.large_segment_size
        return LARGE_BUFFER

    def effective_max_non_split_rounding(self, torch: str | TorchVersion = DEFAULT_TORCH) -> int:
        """Oversize-reuse tolerance: the knob (2.6+) or the release's default."""
        version = parse_torch_version(torch)
        if version >= (2, 6) and self.max_non_split_rounding is not None:
            return self.max_non_split_rounding
        return self.effective_large_segment_size(version)

    def get(self, key: str) -> str | None:
        """The text value of a knob kept in `other` (None when not set)."""
        knob = KNOB_BY_SPELLING.get(key)
        name = knob.name if knob else key
        return dict(self.other).get(name)

    @property
    def throw_on_cudamalloc_oom(self) -> bool:
        return self.get("throw_on_cudamalloc_oom") == "True"

    # ---- text -----------------------------------------------------------------------------

    def items(self) -> list[tuple[str, str]]:
        """(key, value text) pairs in canonical key order, only for knobs that are set."""
        out: list[tuple[str, str]] = []
        if self.backend != "native":
            out.append(("backend", self.backend))
        if self.large_segment_size is not None:
            out.append(("large_segment_size_mb", str(self.large_segment_size // MiB)))
        if self.max_split_size is not None:
            out.append(("max_split_size_mb", str(self.max_split_size // MiB)))
        if self.max_non_split_rounding is not None:
            out.append(("max_non_split_rounding_mb", str(self.max_non_split_rounding // MiB)))
        rd = self.roundup_power2_divisions
        if isinstance(rd, int):
            out.append(("roundup_power2_divisions", str(rd)))
        elif rd is not None:
            out.append(("roundup_power2_divisions", "[" + ",".join(f"{k}:{v}" for k, v in rd) + "]"))
        if self.garbage_collection_threshold:
            out.append(("garbage_collection_threshold", _format_float(self.garbage_collection_threshold)))
        if self.expandable_segments:
            out.append(("expandable_segments", "True"))
        if self.per_process_memory_fraction is not None:
            out.append(("per_process_memory_fraction", _format_float(self.per_process_memory_fraction)))
        out.extend(self.other)
        out.sort(key=lambda kv: CANONICAL_ORDER[kv[0]])
        return out

    def format(self) -> str:
        """The canonical setting string: canonical keys and order, MB values as PyTorch reads them.

        `AllocatorConfig.parse(c.format()) == c` for every config valid in that release.
        """
        return ",".join(f"{k}:{v}" for k, v in self.items())

    def __str__(self) -> str:
        return self.format()

    def normalized(self) -> "AllocatorConfig":
        """The same allocator behaviour, written with nothing that is a no-op as an env setting.

        Drops knobs set to their default in every release that knows them (`large_segment_size_mb:20`,
        `per_process_memory_fraction:1.0`, `release_lock_on_cudamalloc:False`, a non-split
        rounding equal to its default), an all-zero roundup list, and writes a roundup list
        that gives one value everywhere (in every release) as the single form. Idempotent.
        """
        lss = None if self.large_segment_size == LARGE_BUFFER else self.large_segment_size
        nsr = self.max_non_split_rounding
        if nsr is not None and nsr == (lss or LARGE_BUFFER):
            nsr = None
        frac = None if self.per_process_memory_fraction == 1.0 else self.per_process_memory_fraction
        rd = self.roundup_power2_divisions
        if isinstance(rd, tuple):
            tables = {roundup_table_of(rd, v) for v in ("2.9", "2.10")}
            if len(tables) == 1:
                (table,) = tables
                if not any(table):
                    rd = None
                elif len(set(table)) == 1 and all(v > 0 for v in table):
                    rd = table[0]
        other = tuple((k, v) for k, v in self.other if OTHER_DEFAULTS.get(k) != v)
        return replace(
            self,
            large_segment_size=lss,
            max_non_split_rounding=nsr,
            per_process_memory_fraction=frac,
            roundup_power2_divisions=rd,
            other=other,
        )

    def to_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a child process: `base` (if given) plus this setting in both variables.

        Both `PYTORCH_CUDA_ALLOC_CONF` and `PYTORCH_ALLOC_CONF` get the same string because
        torch ≤2.9 reads only the former while 2.10+ takes the first one set of
        (`PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_HIP_ALLOC_CONF`, `PYTORCH_ALLOC_CONF`) without
        merging. Writing both means every release sees exactly this string, and a stale value
        inherited in either variable cannot silently override it. The default config is
        written as `""`, which every release reads as "all defaults".
        """
        env = dict(base) if base is not None else {}
        text = self.format()
        for var in ENV_VARS:
            env[var] = text
        return env

    # ---- plain data -----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        rd = self.roundup_power2_divisions
        return {
            "schema": SCHEMA,
            "string": self.format(),
            "backend": self.backend,
            "max_split_size": self.max_split_size,
            "max_non_split_rounding": self.max_non_split_rounding,
            "garbage_collection_threshold": self.garbage_collection_threshold,
            "expandable_segments": self.expandable_segments,
            "large_segment_size": self.large_segment_size,
            "per_process_memory_fraction": self.per_process_memory_fraction,
            "roundup_power2_divisions": [list(i) for i in rd] if isinstance(rd, tuple) else rd,
            "other": dict(self.other),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AllocatorConfig":
        schema = data.get("schema", SCHEMA)
        if schema != SCHEMA and schema not in _OLD_SCHEMAS:
            raise ConfigError(f"allocator config schema {schema!r} is not supported (expected {SCHEMA})")
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        rd = kwargs.get("roundup_power2_divisions")
        if isinstance(rd, list):
            kwargs["roundup_power2_divisions"] = tuple(tuple(i) for i in rd)
        if "other" in kwargs:
            kwargs["other"] = tuple(dict(kwargs["other"]).items())
        return cls(**kwargs)


# ---- reading a setting ----------------------------------------------------------------------
@dataclass
class ParseResult:
    config: AllocatorConfig
    notes: list[Note] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # canonical keys in the order given (repeats kept)


def parse_detailed(text: str | None, torch: str | TorchVersion = DEFAULT_TORCH) -> ParseResult:
    """Parse and also return the notes about text PyTorch ignores silently."""
    version = parse_torch_version(torch)
    if text is None:
        return ParseResult(AllocatorConfig())
    if not isinstance(text, str):
        raise ConfigError(f"an allocator setting must be text, got {type(text).__name__}")
    read = read_text(text, version)
    return ParseResult(AllocatorConfig(**read.fields), read.notes, read.keys)


def parse_config(text: str | None, torch: str | TorchVersion = DEFAULT_TORCH) -> AllocatorConfig:
    return parse_detailed(text, torch).config


def config_from_allocator_settings(settings: Mapping[str, Any], torch: str | TorchVersion = DEFAULT_TORCH) -> AllocatorConfig:
    """Rebuild the config a recorded run used from a snapshot's `allocator_settings`.

    The recorded values are what the allocator really ran with, so they win; the recorded
    string supplies what the snapshot does not record (non-split rounding, large segment
    size, the exact roundup list) when it agrees with the values.
    """
    version = parse_torch_version(torch)
    text = settings.get("PYTORCH_CUDA_ALLOC_CONF") or settings.get("PYTORCH_ALLOC_CONF") or ""
    try:
        base = parse_config(str(text), version)
    except ConfigError:
        base = AllocatorConfig()
    changes: dict[str, Any] = {}

    mss = settings.get("max_split_size")
    if mss is not None:
        mss = int(mss)
        mss = None if mss < 0 or mss >= MAX_MB * MiB else mss
        if mss is not None and mss % MiB:
            raise ConfigError(f"recorded max_split_size {mss} is not a whole number of MiB")
        changes["max_split_size"] = mss
    if "garbage_collection_threshold" in settings:
        changes["garbage_collection_threshold"] = float(settings["garbage_collection_threshold"] or 0.0)
    if "expandable_segments" in settings:
        changes["expandable_segments"] = bool(settings["expandable_segments"])
    if settings.get("backend") in ("native", "cudaMallocAsync"):
        changes["backend"] = settings["backend"]
    rd = settings.get("roundup_power2_divisions")
    if isinstance(rd, Mapping):
        recorded = [0] * 16
        for k, v in rd.items():
            mb = int(k)
            if _is_pow2(mb):
                recorded[min(mb.bit_length() - 1, 15)] = int(v)
        if tuple(recorded) != base.roundup_table(format_version(version)):
            changes["roundup_power2_divisions"] = setting_from_table(recorded)
    elif isinstance(rd, int) and not isinstance(rd, bool):
        changes["roundup_power2_divisions"] = rd or None

    other = dict(base.other)
    for knob in KNOBS:
        if knob.name in TYPED_KNOBS or knob.name not in settings:
            continue
        raw = settings[knob.name]
        text_value = ("True" if raw else "False") if knob.kind == BOOL else str(int(raw))
        if other.get(knob.name, OTHER_DEFAULTS.get(knob.name, "")) != text_value:
            other[knob.name] = text_value
    changes["other"] = tuple(other.items())
    return replace(base, **changes)
