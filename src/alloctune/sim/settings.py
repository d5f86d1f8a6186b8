"""The allocator knobs the simulator needs, as plain numbers, and the torch version's rule set.

The simulator's hot path reads only this small frozen object, never a config parser: it can
be built from a recorded snapshot's `allocator_settings` dict, from `alloctune.config.
AllocatorConfig`, or directly in tests. Bytes are ints; `None` means "unset/unlimited".
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from alloctune.errors import ConfigError
from alloctune.units import MiB

LARGE_BUFFER = 20 * MiB  # kLargeBuffer: default large-segment size and NSR
NUM_BUCKETS = 16  # roundup_power2_divisions buckets (< 2 MiB ... >= 32 GiB)
DEFAULT_TORCH = "2.11"


def parse_torch_version(text: str | tuple[int, int] | None) -> tuple[int, int]:
    """'2.11', '2.11.0+cu130' or (2, 11) -> (2, 11); None means the default release (2.11).

    The rules differ by minor release; the one version parser of the project lives in
    `alloctune.config.versions` (it also refuses releases we have no rules for)."""
    from alloctune.config.versions import parse_torch_version as parse

    return parse(DEFAULT_TORCH if text is None else text)


@dataclass(frozen=True)
class SimSettings:
    """What one allocator run is configured with (the subset that changes simulation results)."""

    max_split_size: int | None = None  # bytes; None = unlimited (SIZE_MAX)
    max_non_split_rounding: int | None = None  # bytes; None = the version's default
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    large_segment_size: int | None = None  # bytes (2.11+); None = 20 MiB
    roundup_power2_divisions: tuple[int, ...] = field(default=(0,) * NUM_BUCKETS)
    torch: tuple[int, int] = (2, 11)
    per_process_memory_fraction: float | None = None  # 2.10+ config key: a cap without an API call

    # ---- derived values the allocator uses -------------------------------------------------
    @property
    def segment_size_mid(self) -> int:
        """cudaMalloc size for requests in (1 MiB, 10 MiB): 20 MiB, or large_segment_size (2.11+)."""
        if self.torch >= (2, 11) and self.large_segment_size:
            return self.large_segment_size
        return LARGE_BUFFER

    @property
    def nsr(self) -> int:
        """Rule-B slack: an oversize request may take a cached block < size + this."""
        if self.torch < (2, 6):
            return LARGE_BUFFER
        if self.max_non_split_rounding is not None:
            return self.max_non_split_rounding
        return self.segment_size_mid

    @property
    def seg_id_tiebreak(self) -> bool:
        """2.12+: equal-size free blocks are ordered by segment creation, then address."""
        return self.torch >= (2, 12)

    def with_torch(self, torch: str | tuple[int, int]) -> "SimSettings":
        return replace(self, torch=parse_torch_version(torch))

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_split_size": self.max_split_size,
            "max_non_split_rounding": self.max_non_split_rounding,
            "garbage_collection_threshold": self.garbage_collection_threshold,
            "expandable_segments": self.expandable_segments,
            "large_segment_size": self.large_segment_size,
            "roundup_power2_divisions": list(self.roundup_power2_divisions),
            "torch": "%d.%d" % self.torch,
            "per_process_memory_fraction": self.per_process_memory_fraction,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SimSettings":
        return cls(
            max_split_size=d.get("max_split_size"),
            max_non_split_rounding=d.get("max_non_split_rounding"),
            garbage_collection_threshold=float(d.get("garbage_collection_threshold") or 0.0),
            expandable_segments=bool(d.get("expandable_segments")),
            large_segment_size=d.get("large_segment_size"),
            roundup_power2_divisions=tuple(d.get("roundup_power2_divisions") or (0,) * NUM_BUCKETS),
            torch=parse_torch_version(d.get("torch")),
            per_process_memory_fraction=d.get("per_process_memory_fraction"),
        )

    @classmethod
    def from_allocator_settings(cls, recorded: Mapping[str, Any], torch: str | tuple[int, int] | None = None) -> "SimSettings":
        """From a snapshot's `allocator_settings` (what the allocator really ran with).

        The dict lacks `large_segment_size`/`max_non_split_rounding`; they are read from the
        recorded string when it names them.
        """
        mss = recorded.get("max_split_size", -1)
        rt = recorded.get("roundup_power2_divisions") or {}
        if isinstance(rt, Mapping):
            table = tuple(int(rt.get(str(1 << i), 0)) for i in range(NUM_BUCKETS))
        else:
            table = tuple(int(x) for x in rt) or (0,) * NUM_BUCKETS
        text = str(recorded.get("PYTORCH_CUDA_ALLOC_CONF") or "")
        extra = _mb_keys(text)
        return cls(
            max_split_size=None if mss is None or int(mss) < 0 else int(mss),
            max_non_split_rounding=extra.get("max_non_split_rounding_mb"),
            garbage_collection_threshold=float(recorded.get("garbage_collection_threshold") or 0.0),
            expandable_segments=bool(recorded.get("expandable_segments")),
            large_segment_size=extra.get("large_segment_size_mb"),
            roundup_power2_divisions=table,
            torch=parse_torch_version(torch),
        )

    @classmethod
    def from_config(cls, config: Any, torch: str | tuple[int, int] | None = None) -> "SimSettings":
        """From an `alloctune.config.AllocatorConfig` (duck-typed, so the parser stays optional) or
        a `PYTORCH_CUDA_ALLOC_CONF` string (parsed, never silently read as the defaults)."""
        if config is None:
            return cls(torch=parse_torch_version(torch))
        if isinstance(config, SimSettings):
            return config if torch is None else config.with_torch(torch)
        ver = parse_torch_version(torch)
        if isinstance(config, str):  # a PYTORCH_CUDA_ALLOC_CONF string ("" = the defaults)
            from alloctune.config import parse_config

            config = parse_config(config, "%d.%d" % ver)
        backend = getattr(config, "backend", None)
        if backend not in (None, "native"):
            raise ConfigError(
                f"backend:{backend} is a different allocator; the simulator models the native "
                "caching allocator only (drop backend: from the setting)"
            )
        table_fn = getattr(config, "roundup_table", None)
        if callable(table_fn):
            table = tuple(int(x) for x in table_fn("%d.%d" % ver))
        else:
            table = tuple(getattr(config, "roundup_power2_divisions", None) or (0,) * NUM_BUCKETS)
        return cls(
            max_split_size=getattr(config, "max_split_size", None),
            max_non_split_rounding=getattr(config, "max_non_split_rounding", None),
            garbage_collection_threshold=float(getattr(config, "garbage_collection_threshold", 0.0) or 0.0),
            expandable_segments=bool(getattr(config, "expandable_segments", False)),
            large_segment_size=getattr(config, "large_segment_size", None),
            roundup_power2_divisions=table,
            torch=ver,
            per_process_memory_fraction=getattr(config, "per_process_memory_fraction", None) if ver >= (2, 10) else None,
        )


def _mb_keys(text: str) -> dict[str, int]:
    """Pull `*_mb:N` keys out of a recorded allocator string (only the two the dict lacks)."""
    out: dict[str, int] = {}
    for item in text.replace(" ", "").split(","):
        key, _, value = item.partition(":")
        if key in ("max_non_split_rounding_mb", "large_segment_size_mb") and value.isdigit():
            out[key] = int(value) * MiB
    return out
