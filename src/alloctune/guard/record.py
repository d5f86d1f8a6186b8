"""The JSON form the guard's result records share (`ChunkRun`, `JanitorStep`, counters, ...).

Why one base: every record wrote the same `to_dict` (its fields under one `schema`) and most
the same `from_dict` (the fields by name); a record whose values need converting back (ints
from text, optional fields) overrides `from_dict` only.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, TypeVar

SCHEMA = 1

R = TypeVar("R", bound="GuardRecord")


class GuardRecord:
    """Mixin for a frozen dataclass of plain values."""

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})  # type: ignore[attr-defined]
