"""PyTorch's allocator-setting grammar, release by release, with PyTorch's own error texts.

Written from PyTorch's parsers, `c10/cuda/CUDAAllocatorConfig.cpp` (≤2.9) and
`c10/core/AllocatorConfig.cpp` (2.10+): a tokenizer that makes
`, : [ ]` tokens of their own and drops spaces, then `key:value` pairs separated by commas
(a trailing comma is fine, a repeated key overrides the earlier one). Numbers are read the
way C++ `stoi`/`stoull`/`stod` read them: leading digits count, trailing text is ignored
(as in PyTorch; `check` points it out). Separators are checked as ≤2.9 checks them: the 2.10+
tokenizer only bounds-checks `:`/`,` and may misread a malformed string, which we refuse.
Verified against the real 2.13 parser in the tests (generic keys) and on a GPU (tests/test_config_gpu.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from difflib import get_close_matches
from typing import Any

from alloctune.config.knobs import (
    BACKEND,
    BOOL,
    FLOAT,
    INT,
    KNOB_BY_SPELLING,
    MB,
    ROUNDUP,
    TYPED_KNOBS,
    Knob,
)
from alloctune.config.values import MAX_MB, RoundupItem, _is_pow2, apply_roundup, setting_from_table
from alloctune.config.versions import DEFAULT_TORCH, TorchVersion, format_version, parse_torch_version
from alloctune.errors import ConfigError
from alloctune.units import MiB

PUNCT = frozenset(",:[]")
_C_SPACE = " \t\n\v\f\r"


class ConfigSyntaxError(ConfigError):
    """A setting string a given torch release rejects; carries the key and PyTorch's own text."""

    def __init__(self, message: str, key: str | None = None, torch_message: str | None = None):
        super().__init__(message)
        self.key = key
        self.torch_message = torch_message


@dataclass
class Note:
    """Something PyTorch accepts silently but a user probably did not mean (for `check`)."""

    code: str
    key: str
    message: str


@dataclass
class ParsedText:
    """What the grammar read: `AllocatorConfig`'s fields (built by `config.model`), notes, keys in order."""

    fields: dict[str, Any]
    notes: list[Note] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # canonical keys in the order given (repeats kept)


def read_text(text: str, version: TorchVersion) -> ParsedText:
    """Read one setting string with the grammar, limits and messages of `version`."""
    return _Parser(text, version).run()


def tokenize(text: str, torch: str | TorchVersion = DEFAULT_TORCH) -> list[str]:
    """Split like PyTorch: `, : [ ]` are tokens; ≤2.9 drops only ' ', 2.10+ any C whitespace."""
    version = parse_torch_version(torch)
    drop = " " if version <= (2, 9) else _C_SPACE
    tokens: list[str] = []
    word: list[str] = []
    for ch in text:
        if ch in PUNCT:
            if word:
                tokens.append("".join(word))
                word = []
            tokens.append(ch)
        elif ch not in drop:
            word.append(ch)
    if word:
        tokens.append("".join(word))
    return tokens


_INT_PREFIX = re.compile(r"[ \t\n\v\f\r]*([+-]?)([0-9]+)")
_FLOAT_PREFIX = re.compile(
    r"[ \t\n\v\f\r]*([+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan))",
    re.IGNORECASE,
)
# strtod also reads C99 hex floats (`0x0.8p0` = 0.5).
_HEX_FLOAT_PREFIX = re.compile(r"[ \t\n\v\f\r]*([+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?)")


class _Parser:
    def __init__(self, text: str, version: TorchVersion):
        self.text = text
        self.v = version
        self.new = version >= (2, 10)  # unified c10 tokenizer and ValueError texts
        self.tokens = tokenize(text, version)
        self.notes: list[Note] = []
        self.keys: list[str] = []

    # ---- errors -----------------------------------------------------------------------

    def fail(
        self, problem: str, torch_message: str | None = None, key: str | None = None, note: str | None = None
    ) -> ConfigSyntaxError:
        """The error to raise: our wording, then torch's own message (quoted) or a note about torch."""
        msg = problem
        if torch_message:
            tail = f"; {note}" if note else ""
            msg += f' (torch {format_version(self.v)}: "{torch_message.strip()}"{tail})'
        elif note:
            msg += f" (torch {format_version(self.v)} {note})"
        return ConfigSyntaxError(_printable(msg), key=key, torch_message=torch_message)

    def expect(self, i: int, tok: str, key: str) -> None:
        if i >= len(self.tokens):
            if tok == ":":
                raise self.fail(
                    f"'{key}' has no value: write {key}:VALUE",
                    "Index out of bounds in ConfigTokenizer"
                    if self.new
                    else f"Error parsing CachingAllocator settings, expected {tok}",
                    key,
                    note="an internal assert that aborts the process at import" if self.new else None,
                )
            raise self.fail(f"setting string ends early after '{key}': expected '{tok}'", None, key)
        got = self.tokens[i]
        if got != tok:
            hint = ""
            if tok == ":" and "=" in key:
                hint = " (use ':' between a key and its value, not '=')"
            elif tok == "," and got == ":":
                hint = " (a value cannot contain ':'; separate settings with ',')"
            where = f"after '{key}'"
            # ≤2.9 checks separators; the 2.10+ tokenizer only bounds-checks them and reads on,
            # so torch may misread such a string instead of refusing it — refuse it here.
            if self.new:
                raise self.fail(
                    f"expected '{tok}' {where}, got '{got}'{hint}",
                    None,
                    key,
                    note="does not check this separator and may misread the setting",
                )
            raise self.fail(
                f"expected '{tok}' {where}, got '{got}'{hint}", f"Error parsing CachingAllocator settings, expected {tok}", key
            )

    def value_token(self, i: int, key: str) -> str:
        if i >= len(self.tokens):
            raise self.fail(
                f"'{key}' has no value: write {key}:VALUE",
                "Index out of bounds in ConfigTokenizer" if self.new else f"Error, expecting {key} value",
                key,
                note="an internal assert that aborts the process at import" if self.new else None,
            )
        return self.tokens[i]

    # ---- numbers, read like the C++ library functions PyTorch uses ---------------------

    def c_uint(self, token: str, key: str, func: str | None = None) -> int:
        """Whole number as stoi (≤2.9) / stoull (2.10+) reads it; negatives are refused."""
        func = func or ("stoull" if self.new else "stoi")
        m = _INT_PREFIX.match(token)
        if not m:
            raise self.fail(f"{key} needs a whole number, got '{token}'", func, key)
        sign, digits = m.groups()
        value = int(digits)
        limit = 2**31 - 1 if func == "stoi" else 2**64 - 1
        if value > limit:
            raise self.fail(f"{key} value '{token}' is out of range", func, key)
        if sign == "-" and value:
            # C++ would wrap this to a huge unsigned number; nobody means that.
            raise self.fail(
                f"{key} must not be negative, got '{token}' (PyTorch would wrap it around to a huge number)", None, key
            )
        rest = token[m.end() :]
        if rest:
            self.notes.append(
                Note("ignored-suffix", key, f"{key}:{token} is read by PyTorch as {value}; the trailing '{rest}' is ignored")
            )
        return value

    def c_double(self, token: str, key: str) -> float:
        m = _HEX_FLOAT_PREFIX.match(token)
        if m:
            text = m.group(1)
            value = float.fromhex(text if "p" in text.lower() else text + "p0")
        else:
            m = _FLOAT_PREFIX.match(token)
            if not m:
                raise self.fail(f"{key} needs a number, got '{token}'", "stod", key)
            value = float(m.group(1))
        if math.isinf(value) and "inf" not in m.group(1).lower():
            raise self.fail(f"{key} value '{token}' is out of range", "stod", key)
        rest = token[m.end() :]
        if rest:
            self.notes.append(
                Note("ignored-suffix", key, f"{key}:{token} is read by PyTorch as {value!r}; the trailing '{rest}' is ignored")
            )
        return value

    def boolean(self, token: str, index: int, knob: Knob) -> bool:
        if token in ("True", "False"):
            return token == "True"
        torch_msg = (
            f"Expected 'True' or 'False' at index {index} in ConfigTokenizer but got '{token}'"
            if self.new
            else f"Expected a single True/False argument for {knob.name}"
        )
        raise self.fail(f"{knob.name} must be exactly True or False, got '{token}'", torch_msg, knob.name)

    # ---- the grammar --------------------------------------------------------------------

    def unknown(self, key: str, last: bool = False) -> ConfigSyntaxError:
        """An unknown key; `last`: nothing follows it, where the newer parser's generic pass, which skips a
        key it does not know past its ':', runs out of tokens before the CUDA pass names the key
        (torch 2.11 on the GPU aborts with that message: tests/test_config_gpu.py, case bad_equals)."""
        torch_msg = (
            ("Index out of bounds in ConfigTokenizer" if last else f"Unrecognized key '{key}' in CUDA allocator config.")
            if self.new
            else f"Unrecognized CachingAllocator option: {key}"
        )
        if key in PUNCT:
            return self.fail(f"stray '{key}' where a key was expected", torch_msg, key)
        problem = f"unknown key '{key}'"
        knob = KNOB_BY_SPELLING.get(key)
        if knob is not None:
            problem = f"'{key}' is not accepted by torch {format_version(self.v)} (it exists in torch {knob.versions()})"
        else:
            base = key.split("=", 1)[0]
            if "=" in key and base in KNOB_BY_SPELLING:
                problem += " (use ':' between a key and its value, not '=')"
            else:
                close = get_close_matches(key.lower(), list(KNOB_BY_SPELLING), n=1, cutoff=0.75)
                if close:
                    problem += f"; did you mean '{close[0]}'?"
        return self.fail(problem, torch_msg, key)

    def run(self) -> ParsedText:
        toks = self.tokens
        # 2.11+ reads large_segment_size_mb before everything else (the MB minima depend on it).
        large_segment = None
        if self.v >= (2, 11):
            i = 0
            while i < len(toks):
                if toks[i] == "large_segment_size_mb":
                    self.expect(i + 1, ":", toks[i])
                    large_segment = self.mb_value(i + 2, KNOB_BY_SPELLING["large_segment_size_mb"], None)
                    i += 2
                i += 1
        minimum_mb = (large_segment or 20 * MiB) // MiB

        values: dict[str, Any] = {}
        if large_segment is not None:
            values["large_segment_size_mb"] = large_segment
        table: list[int] | None = None  # roundup state while parsing
        roundup_setting: Any = None
        roundup_count = 0
        i = 0
        while i < len(toks):
            key = toks[i]
            knob = KNOB_BY_SPELLING.get(key)
            if knob is None or not knob.known_in(self.v):
                raise self.unknown(key, last=i + 1 == len(toks) and key not in PUNCT)
            self.keys.append(knob.name)
            self.expect(i + 1, ":", key)
            i += 2
            tok = self.value_token(i, knob.name)
            if knob.name == "large_segment_size_mb":
                pass  # read in the first pass
            elif knob.kind == MB:
                values[knob.name] = self.mb_value(i, knob, minimum_mb)
            elif knob.kind == ROUNDUP:
                setting, i = self.roundup(i, knob)
                roundup_count += 1
                if table is None:
                    table = [0] * 16
                table = list(apply_roundup(table, setting, self.v))
                roundup_setting = setting
            elif knob.kind == BOOL:
                values[knob.name] = self.boolean(tok, i, knob)
            elif knob.kind == FLOAT:
                values[knob.name] = self.float_value(tok, knob)
            elif knob.kind == BACKEND:
                if tok not in ("native", "cudaMallocAsync"):
                    raise self.fail(
                        f"backend must be native or cudaMallocAsync, got '{tok}'",
                        "Unknown allocator backend, options are native and cudaMallocAsync",
                        key,
                    )
                values["backend"] = tok
            elif knob.kind == INT:
                values[knob.name] = self.int_value(tok, knob)
            # After a value: a comma, or the end (a trailing comma is accepted).
            if i + 1 < len(toks):
                self.expect(i + 1, ",", knob.name)
                i += 1
            i += 1

        if roundup_count > 1:
            # A repeated roundup key accumulates on the table of this parse; keep the result.
            roundup_setting = setting_from_table(table or [0] * 16)
            if roundup_setting is None:
                roundup_setting = ()
        other = {
            k: ("True" if v is True else "False" if v is False else str(v)) for k, v in values.items() if k not in TYPED_KNOBS
        }
        fields = dict(
            backend=values.get("backend", "native"),
            max_split_size=values.get("max_split_size_mb"),
            max_non_split_rounding=values.get("max_non_split_rounding_mb"),
            garbage_collection_threshold=values.get("garbage_collection_threshold", 0.0),
            expandable_segments=values.get("expandable_segments", False),
            large_segment_size=values.get("large_segment_size_mb"),
            per_process_memory_fraction=values.get("per_process_memory_fraction"),
            roundup_power2_divisions=roundup_setting,
            other=tuple(other.items()),
        )
        return ParsedText(fields, self.notes, self.keys)

    def mb_value(self, i: int, knob: Knob, minimum_mb: int | None) -> int:
        tok = self.value_token(i, knob.name)
        mb = self.c_uint(tok, knob.name)
        name = knob.name
        if name == "large_segment_size_mb":
            if mb <= 10:
                raise self.fail(
                    f"{name}:{mb} is too small: it must be more than 10",
                    "CachingAllocator option large_segment_size_mb must be > 10 MB",
                    name,
                )
        elif self.v <= (2, 9):
            if mb <= 20:
                raise self.fail(
                    f"{name}:{mb} is too small: torch {format_version(self.v)} needs more than 20",
                    f"CachingAllocator option {name} too small, must be > 20",
                    name,
                )
        else:
            assert minimum_mb is not None
            if mb < minimum_mb:
                why = "" if minimum_mb == 20 else " (large_segment_size_mb)"
                raise self.fail(
                    f"{name}:{mb} is too small: it must be at least {minimum_mb}{why}",
                    f"CachingAllocator option {name} too small, must be >= {minimum_mb}",
                    name,
                )
        return min(mb, MAX_MB) * MiB

    def float_value(self, tok: str, knob: Knob) -> float:
        x = self.c_double(tok, knob.name)
        if knob.name == "garbage_collection_threshold":
            if self.new:
                if not (0 < x < 1):
                    raise self.fail(
                        f"garbage_collection_threshold must be between 0 and 1 (exclusive), got {tok}",
                        "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
                        knob.name,
                    )
            elif not x > 0:
                raise self.fail(
                    f"garbage_collection_threshold must be more than 0, got {tok}",
                    "garbage_collect_threshold too small, set it 0.0~1.0",
                    knob.name,
                )
            elif not x < 1:
                raise self.fail(
                    f"garbage_collection_threshold must be less than 1, got {tok}",
                    "garbage_collect_threshold too big, set it 0.0~1.0",
                    knob.name,
                )
        else:  # per_process_memory_fraction
            if not (0 <= x <= 1):
                raise self.fail(
                    f"per_process_memory_fraction must be between 0 and 1, got {tok}",
                    "per_process_memory_fraction is invalid, set it in [0.0, 1.0]",
                    knob.name,
                )
        return x

    def int_value(self, tok: str, knob: Knob) -> int:
        n = self.c_uint(tok, knob.name)
        if knob.name == "pinned_num_register_threads":
            if not _is_pow2(n):
                raise self.fail(
                    f"pinned_num_register_threads must be a power of 2, got {n}",
                    "Number of register threads has to be power of 2",
                    knob.name,
                )
            if n > 128:
                raise self.fail(
                    f"pinned_num_register_threads must be at most 128, got {n}",
                    "Number of register threads should be less than or equal to 128",
                    knob.name,
                )
        elif knob.name == "pinned_reserve_segment_size_mb" and n <= 0:
            raise self.fail(
                "pinned_reserve_segment_size_mb must be more than 0",
                "Pinned reserve segment size has to be greater than 0",
                knob.name,
            )
        return n

    def roundup(self, i: int, knob: Knob) -> tuple[Any, int]:
        """Read a roundup value at token i; returns (setting, index of its last token)."""
        name = knob.name
        spelled = "divisions" if self.v >= (2, 8) else "divisons"
        tok = self.tokens[i]
        if tok != "[":
            n = self.c_uint(tok, name)
            if not _is_pow2(n):
                raise self.fail(
                    f"roundup_power2_divisions:{tok}: the number of divisions must be a power of 2",
                    f"For roundups, the {spelled} has to be power of 2",
                    name,
                )
            return n, i
        items: list[RoundupItem] = []
        zero_ok = self.v >= (2, 4)
        while True:
            i += 1
            if i >= len(self.tokens):
                raise self.fail(
                    "roundup_power2_divisions list has no closing ']'",
                    "Expected closing bracket ']' in ConfigTokenizer but reached end of config" if self.new else None,
                    name,
                )
            key = self.tokens[i]
            if key == "]":
                return tuple(items), i
            self.expect(i + 1, ":", f"{name} item '{key}'")
            i += 2
            vtok = self.value_token(i, name)
            value = self.c_uint(vtok, name)
            if not (_is_pow2(value) or (zero_ok and value == 0)):
                wording = (
                    f"For roundups, the {spelled} has to be power of 2 or 0 to disable roundup"
                    if zero_ok
                    else f"For roundups, the {spelled} has to be power of 2"
                )
                allowed = "a power of 2 or 0" if zero_ok else "a power of 2"
                raise self.fail(f"roundup_power2_divisions item {key}:{vtok}: divisions must be {allowed}", wording, name)
            if key == ">":
                items.append((">", value))
            else:
                interval = self.c_uint(key, name, "stoull" if self.new else "stoul")
                if not _is_pow2(interval):
                    raise self.fail(
                        f"roundup_power2_divisions interval '{key}' must be a power of 2 (in MB)",
                        "For roundups, the intervals have to be power of 2",
                        name,
                    )
                items.append((str(interval), value))
            if i + 1 >= len(self.tokens):
                raise self.fail(
                    "roundup_power2_divisions list has no closing ']'",
                    "Index out of bounds in ConfigTokenizer" if self.new else None,
                    name,
                    note="an internal assert that aborts the process at import" if self.new else None,
                )
            if self.tokens[i + 1] != "]":
                self.expect(i + 1, ",", f"{name} item '{key}'")
                i += 1


def _printable(text: str) -> str:
    """Escape control characters so an error stays on one readable line."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in text)
