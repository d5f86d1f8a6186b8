"""The one table of every allocator knob PyTorch 2.0–2.15 accepts.

The validator (which keys a release knows), the formatter (canonical key order), the
inert-knob checks (which backend honours what) and `alloctune config knobs` all read this
table, so a knob's facts live in exactly one place. Versions come from the key strings in
each official wheel's `libc10_cuda.so` / `libc10.so` (the strings its parser compares keys with).
"""

from __future__ import annotations

from dataclasses import dataclass

from alloctune.config.versions import NEWEST, TorchVersion, format_version

# Value kinds understood by the parser.
MB = "mb"  # whole MiB count, stored as bytes
INT = "int"  # plain whole number
FLOAT = "float"
BOOL = "bool"  # exactly `True` / `False`
BACKEND = "backend"  # native | cudaMallocAsync
ROUNDUP = "roundup"  # single power of two, or `[K:V,...,>:V]`

# Who honours a knob.
NATIVE = "native"
BOTH = "native+cudaMallocAsync"
HOST = "pinned host allocator"


@dataclass(frozen=True)
class Knob:
    """One key of `PYTORCH_CUDA_ALLOC_CONF`, with the facts a user or validator needs."""

    name: str
    kind: str
    default: str
    meaning: str
    first: TorchVersion
    last: TorchVersion | None  # None: still accepted by the newest release we know
    honoured_by: str
    affects_allocation: bool
    aliases: tuple[str, ...] = ()

    def known_in(self, version: TorchVersion) -> bool:
        """Whether this release's parser accepts the key (an unknown key fails CUDA init)."""
        return self.first <= version and (self.last is None or version <= self.last)

    def versions(self) -> str:
        last = format_version(self.last or NEWEST)
        return f"{format_version(self.first)}–{last}"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "default": self.default,
            "meaning": self.meaning,
            "first": format_version(self.first),
            "last": format_version(self.last) if self.last else None,
            "honoured_by": self.honoured_by,
            "affects_allocation": self.affects_allocation,
            "aliases": list(self.aliases),
        }


# Canonical order: the order `AllocatorConfig.format()` writes keys in (allocation knobs
# first, roughly in the order the allocator consults them; inert knobs after).
KNOBS: tuple[Knob, ...] = (
    Knob(
        "backend",
        BACKEND,
        "native",
        "allocator implementation; cudaMallocAsync hands all caching to the CUDA driver and ignores "
        "every native knob; fixed at library load (cannot change at runtime)",
        (2, 0),
        None,
        BOTH,
        True,
    ),
    Knob(
        "large_segment_size_mb",
        MB,
        "20",
        "segment size for 1–10 MiB requests, large-pool page of expandable segments, and the minimum/default "
        "of max_split_size_mb and max_non_split_rounding_mb; must be > 10",
        (2, 11),
        None,
        NATIVE,
        True,
    ),
    Knob(
        "max_split_size_mb",
        MB,
        "unlimited",
        "blocks this large or larger are never split and small requests never use them; big requests reuse "
        "them only within max_non_split_rounding_mb of their size; limits fragmentation",
        (2, 0),
        None,
        NATIVE,
        True,
    ),
    Knob(
        "max_non_split_rounding_mb",
        MB,
        "20 (2.11+: large_segment_size_mb)",
        "how much larger than the request a cached oversize block may be and still be reused",
        (2, 6),
        None,
        NATIVE,
        True,
    ),
    Knob(
        "roundup_power2_divisions",
        ROUNDUP,
        "0 (off)",
        "round request sizes up to one of N divisions per power of two; single N for every size, or "
        "[MB:N,...,>:N] per size interval; fewer distinct sizes, more reuse, some waste",
        (2, 0),
        None,
        NATIVE,
        True,
    ),
    Knob(
        "garbage_collection_threshold",
        FLOAT,
        "0 (off)",
        "with a per-process memory cap, free idle cached segments (oldest first) once reserved memory "
        "exceeds this fraction of the cap; must be in (0, 1)",
        (2, 0),
        None,
        NATIVE,
        True,
    ),
    Knob(
        "expandable_segments",
        BOOL,
        "False",
        "one growing virtual range per stream and pool instead of fixed cudaMalloc segments; "
        "the strongest cure for fragmentation (Linux only)",
        (2, 1),
        None,
        NATIVE,
        True,
    ),
    Knob(
        "per_process_memory_fraction",
        FLOAT,
        "1.0",
        "memory cap as a fraction of the device, like torch.cuda.set_per_process_memory_fraction; "
        "read when the device allocator is created",
        (2, 10),
        None,
        NATIVE,
        True,
    ),
    Knob(
        "throw_on_cudamalloc_oom",
        BOOL,
        "False",
        "reject a request up front when cudaMalloc would fail instead of freeing cache and retrying",
        (2, 12),
        None,
        NATIVE,
        True,
    ),
    Knob(
        "release_lock_on_cudamalloc",
        BOOL,
        "False",
        "drop the allocator lock around cudaMalloc/cudaFree (multi-threaded throughput only)",
        (2, 2),
        None,
        NATIVE,
        False,
        ("release_lock_on_hipmalloc",),
    ),
    Knob(
        "graph_capture_record_stream_reuse",
        BOOL,
        "False",
        "during CUDA-graph capture, reuse blocks freed on side streams earlier",
        (2, 9),
        None,
        NATIVE,
        False,
    ),
    Knob(
        "pinned_use_cuda_host_register",
        BOOL,
        "False",
        "pinned host memory via malloc + cudaHostRegister instead of cudaHostAlloc",
        (2, 2),
        None,
        HOST,
        False,
        ("pinned_use_hip_host_register",),
    ),
    Knob(
        "pinned_num_register_threads",
        INT,
        "1",
        "threads used to register pinned host memory; power of 2, at most 128",
        (2, 2),
        None,
        HOST,
        False,
    ),
    Knob(
        "pinned_use_background_threads",
        BOOL,
        "False",
        "process pinned-memory events on a background thread",
        (2, 6),
        None,
        HOST,
        False,
    ),
    Knob(
        "pinned_reserve_segment_size_mb",
        INT,
        "0 (off)",
        "reserve one pinned host segment of this size up front; must be > 0",
        (2, 10),
        None,
        HOST,
        False,
    ),
    Knob(
        "pinned_free_catch_all",
        BOOL,
        "False",
        "free cached pinned host blocks on any pinned allocation failure",
        (2, 12),
        None,
        HOST,
        False,
    ),
    Knob(
        "pinned_max_round_threshold_mb",
        INT,
        "unset",
        "pinned host requests above this size are not rounded up to a power of two",
        (2, 13),
        None,
        HOST,
        False,
    ),
    Knob("pinned_max_cached_size_mb", INT, "unset", "upper bound on cached pinned host memory", (2, 13), None, HOST, False),
)

KNOB_BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
# Every spelling a parser accepts → the canonical knob.
KNOB_BY_SPELLING: dict[str, Knob] = {
    **{alias: k for k in KNOBS for alias in k.aliases},
    **KNOB_BY_NAME,
}
CANONICAL_ORDER: dict[str, int] = {k.name: i for i, k in enumerate(KNOBS)}

# Knobs stored in `AllocatorConfig.other` (everything without a typed field). Their values
# are kept as canonical text; defaults are used by `normalized()` to drop explicit no-ops.
TYPED_KNOBS = frozenset(
    {
        "backend",
        "large_segment_size_mb",
        "max_split_size_mb",
        "max_non_split_rounding_mb",
        "roundup_power2_divisions",
        "garbage_collection_threshold",
        "expandable_segments",
        "per_process_memory_fraction",
    }
)
OTHER_DEFAULTS: dict[str, str] = {
    "throw_on_cudamalloc_oom": "False",
    "release_lock_on_cudamalloc": "False",
    "graph_capture_record_stream_reuse": "False",
    "pinned_use_cuda_host_register": "False",
    "pinned_num_register_threads": "1",
    "pinned_use_background_threads": "False",
    "pinned_free_catch_all": "False",
}


def knobs_for(version: TorchVersion | None = None) -> tuple[Knob, ...]:
    """The table, or only the knobs that `version` accepts."""
    if version is None:
        return KNOBS
    return tuple(k for k in KNOBS if k.known_in(version))
