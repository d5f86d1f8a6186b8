"""Resource limits for reading files we did not write (snapshots, compact traces, logs).

Why: these files come from bug reports. A few hundred bytes can describe gigabytes (an xz
of zeros, a pickle memo index of 2**32, "billion laughs" built from shared references), so
every reader checks what the input *claims* before allocating for it. Each limit has a
default that fits every real recording we know of and an environment variable to raise it
for an unusually large but genuine file; the error message names that variable.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from alloctune.errors import InputError
from alloctune.units import GiB

# name of the field -> environment variable that overrides it
ENV = {
    "max_decompressed": "ALLOCTUNE_MAX_DECOMPRESSED",
    "max_ratio": "ALLOCTUNE_MAX_RATIO",
    "max_depth": "ALLOCTUNE_MAX_DEPTH",
    "max_container": "ALLOCTUNE_MAX_CONTAINER",
    "max_objects": "ALLOCTUNE_MAX_OBJECTS",
    "objects_per_byte": "ALLOCTUNE_OBJECTS_PER_BYTE",
}


@dataclass(frozen=True)
class Limits:
    """What a loaded file may make us allocate.

    `max_decompressed`: bytes after gzip/xz/bz2 (a 5M-event snapshot with stacks is < 1 GiB),
    and at most `max_ratio` times the compressed size once past `ratio_floor` bytes (real
    snapshots compress 20-40x; 10 GB of zeros in 2.6 MB is 3,800x).
    `max_depth`: nesting of containers (a snapshot nests 6 deep; deep nesting crashes C code
    that recurses, e.g. hashing a million-deep tuple).
    `max_container`: items in one list/dict/set/tuple.
    `max_objects` / `objects_per_byte`: objects the result expands to when every shared
    reference is counted each time it appears (what `json.dumps` or a walk would touch):
    at most `max(max_objects, objects_per_byte * decompressed size)`.
    """

    schema: int = 1
    max_decompressed: int = 4 * GiB
    max_ratio: int = 200
    ratio_floor: int = 256 << 20
    max_depth: int = 64
    max_container: int = 50_000_000
    max_objects: int = 4_000_000
    objects_per_byte: int = 16

    def decompressed_allowed(self, compressed: int) -> tuple[int, str]:
        """The byte budget for decompressing `compressed` bytes, and the limit's field name."""
        by_ratio = max(self.ratio_floor, self.max_ratio * compressed)
        if by_ratio < self.max_decompressed:
            return by_ratio, "max_ratio"
        return self.max_decompressed, "max_decompressed"

    def objects_allowed(self, nbytes: int) -> int:
        """The expanded-object budget for an input of `nbytes` decompressed bytes."""
        return max(self.max_objects, self.objects_per_byte * nbytes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_env(cls, environ: os._Environ[str] | dict[str, str] | None = None) -> Limits:
        """Defaults overridden by `ALLOCTUNE_MAX_*` variables (sizes accept units: `8GiB`)."""
        env = os.environ if environ is None else environ
        values: dict[str, int] = {}
        for field_name, var in ENV.items():
            text = env.get(var)
            if text is None or not text.strip():
                continue
            values[field_name] = _parse_limit(var, text)
        return cls(**values)


def _parse_limit(var: str, text: str) -> int:
    from alloctune.units import parse_size

    try:
        value = int(text) if text.strip().isdigit() else int(parse_size(text))
    except (ValueError, InputError) as exc:
        raise InputError(f"{var}={text!r} is not a number or size ({exc})") from None
    if value <= 0:
        raise InputError(f"{var} must be positive, got {text!r}")
    return value


def hint(field_name: str) -> str:
    """The sentence that tells the user how to raise one limit."""
    return f"if the file is genuine, raise the limit with {ENV[field_name]}=..."
