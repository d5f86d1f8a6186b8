"""The traces shipped inside the package, addressable by name wherever a recording is taken.

Why in `trace/`: `alloctune demo --list` shows names (`rvc_h200`, `llm_h200_expandable`, ...), and
a newcomer types them next into `simulate`, `explain` or `trace info`. Every command reads its
recording through `trace.load`, so resolving a name there (a path that exists always wins) makes
the names work everywhere at once, with the same wording when one is unknown.

A name is a file's name under `alloctune/data/traces` with or without `.atrace`, or the workload
name recorded in one trace's metadata when no other shipped trace carries it (`rvc_ec1`, which the
demo's header and the shared traces' folder both use, is `rvc_h200_ec1`).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

SUFFIX = ".atrace"


def shipped_dir() -> Path:
    """The folder of the shipped traces (inside the installed package)."""
    return Path(str(resources.files("alloctune") / "data" / "traces"))


def shipped_names() -> list[str]:
    """The names of the shipped traces, without the suffix, sorted (what `demo --list` shows)."""
    root = shipped_dir()
    if not root.is_dir():
        return []
    return sorted(p.name.removesuffix(SUFFIX) for p in root.iterdir() if p.name.endswith(SUFFIX))


def _workload_aliases() -> dict[str, str]:
    """{workload name: shipped name} for workload names (the first word of the recorded `workload`)
    that exactly one shipped trace carries; read from the files' headers only when a name missed."""
    from alloctune.errors import TraceError
    from alloctune.trace.compact import read_compact_header

    owners: dict[str, list[str]] = {}
    for name in shipped_names():
        try:
            meta = read_compact_header(shipped_dir() / f"{name}{SUFFIX}").get("meta") or {}
        except TraceError:
            continue
        workload = str(meta.get("workload") or "").split(" ", 1)[0]
        if workload and workload != name:
            owners.setdefault(workload, []).append(name)
    return {w: names[0] for w, names in owners.items() if len(names) == 1}


def shipped_path(name: str) -> Path | None:
    """The file of the shipped trace `name` (with or without `.atrace`, or a unique workload name),
    None when no shipped trace is called so. A name with a folder in it is never one."""
    text = str(name).strip()
    if not text or "/" in text or "\\" in text:
        return None
    stem = text.removesuffix(SUFFIX)
    names = shipped_names()
    if stem not in names:
        stem = _workload_aliases().get(stem, "")
        if not stem:
            return None
    return shipped_dir() / f"{stem}{SUFFIX}"


def resolve_recording(path: str | Path) -> Path:
    """`path` itself when it exists (a file of the user's always wins), else the shipped trace of
    that name, else `path` unchanged (the loader then says it is missing, naming `demo --list`)."""
    p = Path(path)
    if p.exists():
        return p
    found = shipped_path(str(path))
    return found if found is not None else p


def is_shipped(path: str | Path) -> bool:
    """Whether `path` is one of the shipped trace files (to show its name instead of its path)."""
    try:
        return Path(path).resolve().parent == shipped_dir().resolve() and str(path).endswith(SUFFIX)
    except OSError:
        return False


def unknown_name_hint() -> str:
    """The end of a "no such file" line for a recording: where the shipped names are listed."""
    return "not a file, nor a shipped trace name (see alloctune demo --list)"
