"""`OOMReport`: every figure of one out-of-memory message, in bytes, plus where it was found.

Plain frozen data (no parsing here) so that the verdict, the CLI and other helpers (snapshot
diagnosis) can build and exchange reports without touching the text grammar.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

SCHEMA = "alloctune.oom-report/1"

# Byte fields, in the order they are shown.
BYTE_FIELDS: tuple[str, ...] = (
    "requested",
    "total",
    "free",
    "allocated",
    "active",
    "reserved",
    "reserved_unallocated",
    "private_pools",
    "cap",
    "process_in_use",
    "other_allocations",
)
# The fields an OOM message's figures fill (the device and every byte field): what a message template reads.
FIGURE_FIELDS: tuple[str, ...] = ("device", *BYTE_FIELDS)


@dataclass(frozen=True)
class OOMReport:
    """One out-of-memory message, parsed.

    Byte figures are `None` when the message does not state them (older formats, truncation).
    Names follow PyTorch's: `allocated` is "allocated by PyTorch" (2.4+: it includes live memory
    of private pools), `reserved` is what the caching allocator holds from the device,
    `reserved_unallocated` the part of it that holds no tensor (2.4+: excluding private pools).
    `derived` names the figures computed from others rather than printed (e.g. `reserved` of a
    2.x message is allocated + unallocated).
    """

    vendor: str  # cuda | hip | xpu | mps | npu
    backend: str  # native | cudaMallocAsync
    format: str  # message format id, see parse.FORMATS
    text: str  # the message, whitespace-normalised and un-escaped
    raw: str  # the exact slice of the input
    span: tuple[int, int]  # [start, end) offsets of `raw` in the input
    truncated: bool = False
    device: int | None = None
    requested: int | None = None
    total: int | None = None
    free: int | None = None
    allocated: int | None = None
    active: int | None = None  # torch_npu's "current active"
    reserved: int | None = None
    reserved_unallocated: int | None = None
    private_pools: int | None = None
    cap: int | None = None  # the per-process limit ("X allowed", MPS "max allowed", async "PyTorch limit")
    process_in_use: int | None = None  # "this process has X memory in use" (NVML, includes the context)
    other_allocations: int | None = None  # MPS "other allocations"
    other_processes: tuple[tuple[int, int], ...] = ()  # (pid, bytes) in message order
    derived: tuple[str, ...] = ()
    hint: str | None = None  # the setting the message itself suggested
    docs_url: str | None = None
    torch_hint: str | None = None  # torch versions this format was printed by, e.g. "2.4-2.9"
    platform: str | None = None  # windows | wsl | linux | macos, from the surrounding text
    platform_evidence: str | None = None
    request_pool: str | None = None  # MPS "on private pool"
    location: str | None = None  # pre-1.0: the THC source file:line

    def figures(self) -> dict[str, int]:
        """The byte figures that are known, by name (including each other process as `pid:<n>`)."""
        out = {name: getattr(self, name) for name in BYTE_FIELDS if getattr(self, name) is not None}
        for pid, size in self.other_processes:
            out[f"pid:{pid}"] = size
        return out

    @property
    def other_processes_total(self) -> int:
        return sum(size for _, size in self.other_processes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["span"] = list(self.span)
        d["other_processes"] = {str(pid): size for pid, size in self.other_processes}
        d["derived"] = list(self.derived)
        return {"schema": SCHEMA, **d}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OOMReport:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in known}
        kw["span"] = tuple(kw.get("span", (0, 0)))
        kw["other_processes"] = tuple((int(p), int(s)) for p, s in dict(kw.get("other_processes") or {}).items())
        kw["derived"] = tuple(kw.get("derived", ()))
        return cls(**kw)


__all__ = ["BYTE_FIELDS", "OOMReport", "SCHEMA"]
