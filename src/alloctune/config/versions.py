"""Torch release numbers as the allocator-config rules need them: `(major, minor)`.

Every rule in this package is keyed by the minor release only (2.10 vs 2.11 changes the
grammar; patch releases never did), so a full version string such as `2.11.0+cu130` is
reduced to `(2, 11)` once, at the edge, and compared as a tuple everywhere else.
"""

from __future__ import annotations

import re

from alloctune.errors import InputError

TorchVersion = tuple[int, int]

OLDEST: TorchVersion = (2, 0)
NEWEST: TorchVersion = (2, 15)
DEFAULT_TORCH = "2.11"

# `2.11`, `2.11.0`, `2.11.0+cu130`, `2.11.0a0+git1234`, `2.11.0.dev20260101`, `2.11.0rc1`
_VERSION_RE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.\d+)?(?:[.+\-]?[0-9A-Za-z.+\-]*)?\s*$")


def parse_torch_version(version: str | TorchVersion) -> TorchVersion:
    """`"2.11.0+cu130"` → `(2, 11)`; a version outside 2.0–2.15 is an `InputError`.

    We refuse versions we have no rules for rather than guessing: a config that validates
    against the wrong grammar would be reported as fine and then crash at CUDA init.
    """
    if isinstance(version, tuple):
        if len(version) < 2 or not all(isinstance(p, int) for p in version[:2]):
            raise InputError(f"not a torch version: {version!r}")
        parsed = (version[0], version[1])
    else:
        m = _VERSION_RE.match(str(version))
        if not m:
            raise InputError(f"cannot read torch version {version!r}: expected e.g. 2.11 or 2.11.0+cu130")
        parsed = (int(m.group(1)), int(m.group(2)))
    if not OLDEST <= parsed <= NEWEST:
        raise InputError(
            f"torch {parsed[0]}.{parsed[1]} is not supported: alloctune knows the allocator rules of "
            f"torch {OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]}"
        )
    return parsed


def format_version(version: TorchVersion) -> str:
    return f"{version[0]}.{version[1]}"
