"""Diagnose "out of memory" messages: find them in any text, parse every era, explain, fix.

Pure Python over text: no torch import (an exception object is only turned into its string).

    >>> import alloctune
    >>> d = alloctune.diagnose(log_text)        # the last OOM in the text
    >>> d.verdict, d.evidence, d.fixes[0].shell_forms()["bash"]

`diagnose_all(text)` returns one `Diagnosis` per distinct message (repeats counted in
`occurrences`); `find_reports(text)` only parses. Both are plain functions over plain data so
that other inputs (a memory snapshot) can be diagnosed by composing `diagnose_report`.
"""

from __future__ import annotations

import sys
import traceback
import types

from alloctune.config.checks import PLATFORMS  # one set of platform names for every command
from alloctune.diagnose.diagnosis import VERDICTS, Diagnosis
from alloctune.diagnose.find import find_reports, iter_reports
from alloctune.diagnose.fixes import Fix
from alloctune.diagnose.report import OOMReport
from alloctune.diagnose.text import decode_log
from alloctune.diagnose.verdict import diagnose_report
from alloctune.errors import InputError, NoOOMFound


def as_text(text_or_exception: object) -> str:
    """Text to search: a string as is, bytes decoded, an exception as its message (plus chained causes)."""
    if isinstance(text_or_exception, BaseException):
        return (
            "".join(traceback.format_exception_only(type(text_or_exception), text_or_exception))
            + "\n"
            + "\n".join(str(e) for e in _chain(text_or_exception))
        )
    if isinstance(text_or_exception, (bytes, bytearray)):
        return decode_log(bytes(text_or_exception))
    if isinstance(text_or_exception, str):
        return text_or_exception
    raise InputError(f"cannot diagnose a {type(text_or_exception).__name__}: pass text or an exception")


def _chain(exc: BaseException) -> list[BaseException]:
    out, seen = [], set()
    cur: BaseException | None = exc.__cause__ or exc.__context__
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _check_platform(platform: str | None) -> None:
    if platform is not None and platform not in PLATFORMS:
        raise InputError(f"unknown platform {platform!r}: choose one of {', '.join(PLATFORMS)}")


def diagnose_all(text_or_exception: object, platform: str | None = None, *, dedupe: bool = True) -> list[Diagnosis]:
    """One `Diagnosis` per OOM message in the input, in order. Identical messages (the same text
    logged twice) are merged into the first, with `occurrences` counting them. Raises `NoOOMFound`
    when there is none."""
    _check_platform(platform)
    text = as_text(text_or_exception)
    if not text.strip():
        raise NoOOMFound("the input is empty: give an OOM message, a log containing one, or '-' for stdin")
    reports = find_reports(text, platform)
    if not reports:
        raise NoOOMFound(
            "no out-of-memory message found in the input (looked for 'CUDA/HIP/XPU/NPU out of memory', "
            "'MPS backend out of memory', 'Allocation on device', 'Tried to allocate')"
        )
    out: list[Diagnosis] = []
    index: dict[str, int] = {}
    for rep in reports:
        if dedupe and rep.text in index:
            i = index[rep.text]
            d = out[i]
            out[i] = Diagnosis(
                d.report, d.verdict, d.reason, d.evidence, d.fixes, d.contributing, d.shortfall, d.platform, d.occurrences + 1
            )
            continue
        index[rep.text] = len(out)
        out.append(diagnose_report(rep, platform))
    return out


def diagnose(text_or_exception: object, platform: str | None = None) -> Diagnosis:
    """The `Diagnosis` of the *last* OOM message in a text, log, or exception.

    The last one is the failure that ended the run (earlier ones were caught and retried, or came
    from other ranks). Use `diagnose_all` for every message. Raises `NoOOMFound` if there is none.
    """
    return diagnose_all(text_or_exception, platform, dedupe=False)[-1]


class _CallableModule(types.ModuleType):
    """Importing this subpackage rebinds the attribute `alloctune.diagnose` from the top-level
    function to the module; making the module callable keeps `alloctune.diagnose(text)` working."""

    def __call__(self, text_or_exception: object, platform: str | None = None) -> Diagnosis:
        return diagnose(text_or_exception, platform)


sys.modules[__name__].__class__ = _CallableModule

__all__ = [
    "PLATFORMS",
    "VERDICTS",
    "Diagnosis",
    "Fix",
    "OOMReport",
    "as_text",
    "decode_log",
    "diagnose",
    "diagnose_all",
    "diagnose_report",
    "find_reports",
    "iter_reports",
]
