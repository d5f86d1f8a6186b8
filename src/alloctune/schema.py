"""The one form of the `schema` field every JSON output and file carries.

Why a helper: outputs were written with `"schema": 1`, `"alloctune.simulate/1"` or nothing,
so a program reading several of them could not tell what it had. The form is
`alloctune.<kind>/<version>`: the kind names the output (`simulate`, `config-check`), the
version is bumped when a field changes meaning.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_KIND = re.compile(r"^[a-z][a-z0-9-]*(?:\.[a-z][a-z0-9-]*)*$")
_SCHEMA = re.compile(r"^alloctune\.([a-z][a-z0-9.-]*)/([1-9][0-9]*)$")


def schema_id(kind: str, version: int = 1) -> str:
    """`alloctune.<kind>/<version>`, e.g. `schema_id("simulate")` → `"alloctune.simulate/1"`."""
    if not _KIND.match(kind) or isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"bad schema kind/version: {kind!r}, {version!r}")
    return f"alloctune.{kind}/{version}"


def with_schema(kind: str, data: Mapping[str, Any], version: int = 1) -> dict[str, Any]:
    """`data` with `schema` as its first key (a `schema` already in `data` is replaced)."""
    return {"schema": schema_id(kind, version), **{k: v for k, v in data.items() if k != "schema"}}


def parse_schema(value: Any) -> tuple[str, int] | None:
    """(kind, version) of a `schema` value in the shared form, else None."""
    m = _SCHEMA.match(value) if isinstance(value, str) else None
    return (m.group(1), int(m.group(2))) if m else None
