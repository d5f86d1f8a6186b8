"""The run record beside a trace file: `NAME.json` next to `NAME.pickle[.xz|.gz]` (the shared traces',
`alloctune record`'s). A module of its own so that the loader and its cache both read it without
importing each other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from alloctune.errors import TraceError


def read_sidecar(path: str | Path) -> dict[str, Any]:
    """The `NAME.json` next to `NAME.pickle[.xz|.gz]` (the shared traces' run record), or {}."""
    path = Path(path)
    name = path.name
    for suffix in (".xz", ".gz", ".bz2"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    if name.endswith(".pickle"):
        name = name[: -len(".pickle")]
    elif "." in name:
        name = name.rsplit(".", 1)[0]
    side = path.with_name(name + ".json")
    if side == path or not side.is_file():
        return {}
    try:
        meta = json.loads(side.read_text())
    except (OSError, ValueError) as exc:
        raise TraceError(f"{side}: the sidecar JSON next to the trace is unreadable ({exc}); fix or remove it") from exc
    return meta if isinstance(meta, dict) else {}
