"""Prove a pickle stream safe for the C unpickler before it runs: a pure-Python opcode walk.

Why not just the restricted C unpickler: refusing globals stops code execution, but the C
unpickler still trusts the stream's shape. A 9-byte `LONG_BINPUT 0xfffffff0` makes it grow
its memo table to 4 GB; a chain of a million `TUPLE1` builds a tuple that crashes CPython
(SIGSEGV) when hashed as a dict key; a few hundred bytes of shared references ("billion
laughs") describe a structure that any later walk expands to billions of objects.

`scan` walks the opcodes once without building any object. It keeps, for every stack item,
a *shape*: nesting depth, expanded object count (a shared reference counts every time it
appears), direct length. It admits only the opcodes plain containers and scalars need and
enforces `Limits`; a container may not be modified after it was placed inside another one
(legit pickles fill a container before storing it; the rule rules out cycles and shapes
that grow after they were counted). Anything it accepts is then built by the C unpickler at
full speed; the walk costs several times the C load (bench/snapshot_load.py), so streams as
`_dump_snapshot` writes them take the fast path below (`screen`, then `check_built`) and `scan`
handles the rest and words every refusal.
"""

from __future__ import annotations

import functools
import os
import re
import struct
from typing import Any, Callable, Protocol, cast

from alloctune.errors import TraceError
from alloctune.trace.limits import Limits, hint


class NeedsGlobal(Exception):
    """The stream asks for a global / persistent id / extension: let the restricted unpickler name it."""


class PickleRejected(TraceError):
    """The stream is not plain data within limits (message: what, where, which limit)."""


_SCALAR = (0, 1)  # (depth, expanded objects) of every scalar: immutable and shared

# Opcodes that name code or out-of-band data: refused (the restricted unpickler words the error).
_GLOBALISH = frozenset(b"ci\x93\x82\x83\x84PQ")
# Opcodes that call something or are not plain data at all.
_FORBIDDEN = {
    ord("R"): "REDUCE",
    ord("b"): "BUILD",
    ord("o"): "OBJ",
    0x81: "NEWOBJ",
    0x92: "NEWOBJ_EX",
    0x97: "NEXT_BUFFER",
    0x98: "READONLY_BUFFER",
}
# Fixed-size scalar opcodes: opcode -> argument bytes.
_FIXED_SCALAR = {ord("N"): 0, 0x88: 0, 0x89: 0, ord("K"): 1, ord("M"): 2, ord("J"): 4, ord("G"): 8}
# Length-prefixed scalars: opcode -> bytes of the length field.
_COUNTED_SCALAR = {
    0x8C: 1,
    ord("C"): 1,
    ord("U"): 1,
    0x8A: 1,
    ord("X"): 4,
    ord("B"): 4,
    ord("T"): 4,
    0x8B: 4,
    0x8D: 8,
    0x8E: 8,
    0x96: 8,
}
# Newline-terminated scalars (protocol 0).
_LINE_SCALAR = frozenset(b"IFLSV")
_MAX_LINE = 1 << 16
_U32 = struct.Struct("<I").unpack_from


def _node() -> list:
    """A container's shape: [depth, expanded objects, direct length, sealed]."""
    return [1, 1, 0, False]


class _Walk:
    """The state of one `scan`: the stack of shapes, the marks, the memo, the limits, and one method
    per kind of opcode that is not among the most frequent. Those (memo reads, scalars, marks, empty
    containers: most opcodes of a snapshot) stay inline in `scan`'s loop; filling and building
    containers, PUTs and the rest are methods. Measured on the 54 MB `stacks` snapshot of
    bench/snapshot_load.py: 5.51 s CPU before the split, 5.69 s after (+3%, best of 3)."""

    def __init__(self, data: bytes | bytearray, lim: Limits) -> None:
        self.data = data
        self.n = len(data)
        self.max_depth = lim.max_depth
        self.max_len = lim.max_container
        self.max_objects = lim.objects_allowed(self.n)
        self.max_memo = self.n  # a genuine memo index never exceeds the number of objects, so never the byte count
        self.stack: list = []
        self.marks: list[int] = []
        self.memo: dict[int, object] = {}

    @staticmethod
    def fail(what: str, at: int) -> PickleRejected:
        return PickleRejected(f"{what} (at byte {at})")

    def add(self, parent: list[Any], child: Any, at: int) -> None:
        """Account for `child` becoming an item of container `parent`.

        `child` is a `_node()` or `_SCALAR`, told apart by identity (which types cannot express)."""
        if parent[3]:
            raise self.fail("a container is modified after it was stored inside another one; not plain data", at)
        if child is not _SCALAR:
            if child is parent:
                raise self.fail("a container contains itself (a cycle); not plain data", at)
            child[3] = True
            d = child[0] + 1
            if d > parent[0]:
                if d > self.max_depth:
                    raise self.fail(f"containers nest deeper than {self.max_depth} levels; {hint('max_depth')}", at)
                parent[0] = d
            parent[1] += child[1]
        else:
            parent[1] += 1
        parent[2] += 1
        if parent[2] > self.max_len:
            raise self.fail(f"a container holds more than {self.max_len} items; {hint('max_container')}", at)
        if parent[1] > self.max_objects:
            raise self.fail(
                f"the data expands to more than {self.max_objects} objects (shared references counted "
                f"each time; a 'billion laughs'?); {hint('max_objects')}",
                at,
            )

    def pop_mark(self, at: int) -> int:
        if not self.marks:
            raise self.fail("an opcode needs a MARK that is not there", at)
        return self.marks.pop()

    def sealed_tuple(self, items: list, at: int) -> list:
        t = _node()
        for it in items:
            self.add(t, it, at)
        t[3] = True  # tuples are immutable
        return t

    def fill(self, op: int, at: int) -> None:
        """SETITEMS, APPENDS, ADDITEMS: the items above the last MARK go into the container below it."""
        stack = self.stack
        k = self.pop_mark(at)
        if k == 0 or k > len(stack):
            raise self.fail("no container below the MARK", at)
        parent = stack[k - 1]
        if parent is _SCALAR:
            raise self.fail("items added to something that is not a container", at)
        items = stack[k:]
        del stack[k:]
        if op == 0x75 and len(items) % 2:
            raise self.fail("SETITEMS with an odd number of items", at)
        plain = items.count(_SCALAR)
        if plain == len(items) and not parent[3]:  # the common case: a dict of scalars
            parent[1] += plain
            parent[2] += plain
            if parent[2] > self.max_len or parent[1] > self.max_objects:
                self.add(parent, _SCALAR, at)  # raises with the message
        else:
            for it in items:
                self.add(parent, it, at)

    def fill_one(self, op: int, at: int) -> None:
        """SETITEM, APPEND."""
        stack = self.stack
        need = 3 if op == 0x73 else 2
        if len(stack) - (self.marks[-1] if self.marks else 0) < need:
            raise self.fail("stack underflow", at)
        parent = stack[-need]
        if parent is _SCALAR:
            raise self.fail("items added to something that is not a container", at)
        for it in stack[1 - need :]:
            self.add(parent, it, at)
        del stack[1 - need :]

    def build(self, op: int, at: int) -> None:
        """TUPLE1..3, EMPTY_TUPLE, TUPLE, LIST, DICT, FROZENSET: a container built from stack items."""
        stack = self.stack
        if op in (0x85, 0x86, 0x87):
            k = op - 0x84
            if len(stack) - (self.marks[-1] if self.marks else 0) < k:
                raise self.fail("stack underflow", at)
            items = stack[-k:]
            del stack[-k:]
            stack.append(self.sealed_tuple(items, at))
            return
        if op == 0x29:
            stack.append(self.sealed_tuple([], at))
            return
        k = self.pop_mark(at)
        items = stack[k:]
        del stack[k:]
        if op == 0x64 and len(items) % 2:
            raise self.fail("DICT with an odd number of items", at)
        node = self.sealed_tuple(items, at) if op in (0x74, 0x91) else _node()
        if op in (0x6C, 0x64):
            for it in items:
                self.add(node, it, at)
        stack.append(node)

    def put(self, op: int, pos: int, at: int) -> int:
        """BINPUT, LONG_BINPUT, PUT: store the top under a chosen index (bounded by the file size)."""
        data, n = self.data, self.n
        if op == 0x71:
            if not self.stack or pos >= n:
                raise self.fail("BINPUT on an empty stack", at)
            self.memo[data[pos]] = self.stack[-1]
            return pos + 1
        if op == 0x72:
            if pos + 4 > n:
                raise self.fail("LONG_BINPUT runs past the end of the data", at)
            idx = _U32(data, pos)[0]
            pos += 4
        else:
            idx, pos = _line_int(data, pos, at, self.fail)
        if not self.stack:
            raise self.fail("PUT on an empty stack", at)
        if idx >= self.max_memo:
            raise self.fail(f"memo index {idx} is larger than the file could ever need; a memory bomb", at)
        self.memo[idx] = self.stack[-1]
        return pos

    def other(self, op: int, pos: int, at: int) -> int:
        """GET, POP, POP_MARK, DUP, PROTO, FRAME, and every refusal; the position after the opcode."""
        stack, marks = self.stack, self.marks
        if op == 0x67:  # GET
            idx, pos = _line_int(self.data, pos, at, self.fail)
            try:
                stack.append(self.memo[idx])
            except KeyError:
                raise self.fail(f"memo index {idx} was never stored", at) from None
        elif op == 0x30:  # POP
            if stack and (not marks or len(stack) > marks[-1]):
                stack.pop()
            elif marks:
                marks.pop()
            else:
                raise self.fail("POP on an empty stack", at)
        elif op == 0x31:  # POP_MARK
            del stack[self.pop_mark(at) :]
        elif op == 0x32:  # DUP
            if not stack:
                raise self.fail("DUP on an empty stack", at)
            stack.append(stack[-1])
        elif op == 0x80:  # PROTO
            if pos >= self.n or self.data[pos] > 5:
                raise self.fail("unsupported pickle protocol", at)
            pos += 1
        elif op == 0x95:  # FRAME: only a length hint
            pos += 8
        elif op in _GLOBALISH:
            raise NeedsGlobal(at)
        elif op in _FORBIDDEN:
            raise self.fail(f"opcode {_FORBIDDEN[op]} calls code; a memory snapshot never uses it", at)
        else:
            raise self.fail(f"unknown opcode 0x{op:02x}", at)
        return pos

    def stop(self, pos: int) -> int:
        """STOP: the expanded object count of the one result, if nothing but padding follows."""
        if len(self.stack) != 1 or self.marks:
            raise self.fail("STOP with a malformed stack", pos - 1)
        if pos != self.n and self.data[pos:].strip(b"\x00\n\r \t"):
            raise self.fail(f"{self.n - pos} byte(s) of trailing data after the pickle", pos)
        top = self.stack[0]
        return 1 if top is _SCALAR else top[1]


_FILL = frozenset(b"ue\x90")  # SETITEMS, APPENDS, ADDITEMS
_BUILD = frozenset(b"\x85\x86\x87)tld\x91")  # TUPLE1..3, EMPTY_TUPLE, TUPLE, LIST, DICT, FROZENSET
_PUT = frozenset(b"qrp")  # BINPUT, LONG_BINPUT, PUT


def scan(data: bytes | bytearray, limits: Limits | None = None) -> int:
    """Walk `data`; return the expanded object count of the result, or raise.

    Raises `PickleRejected` (a `TraceError`) naming the opcode and byte offset, or
    `NeedsGlobal` when the stream names a global (the caller re-runs the restricted
    unpickler, which refuses it with the global's name).
    """
    w = _Walk(data, limits or Limits.from_env())
    n, stack, marks, memo, fail = w.n, w.stack, w.marks, w.memo, w.fail
    fixed, counted, scalar, u32 = _FIXED_SCALAR, _COUNTED_SCALAR, _SCALAR, _U32
    push = stack.append
    pos = 0
    while pos < n:
        op = data[pos]
        pos += 1
        if op == 0x6A:  # LONG_BINGET: a third of all opcodes of a snapshot
            try:
                push(memo[u32(data, pos)[0]])
            except (KeyError, struct.error):
                raise fail("LONG_BINGET of a memo index that was never stored", pos - 1) from None
            pos += 4
        elif op == 0x68:  # BINGET
            if pos >= n:
                break
            try:
                push(memo[data[pos]])
            except KeyError:
                raise fail(f"memo index {data[pos]} was never stored", pos - 1) from None
            pos += 1
        elif op == 0x94:  # MEMOIZE
            if not stack:
                raise fail("MEMOIZE on an empty stack", pos - 1)
            memo[len(memo)] = stack[-1]
        elif op in fixed:
            pos += fixed[op]
            push(scalar)
        elif op in counted:
            width = counted[op]
            size = int.from_bytes(data[pos : pos + width], "little")
            pos += width + size
            if pos > n:
                raise fail(f"a {size}-byte value runs past the end of the data (truncated?)", pos - width - size - 1)
            push(scalar)
        elif op == 0x28:  # MARK
            marks.append(len(stack))
        elif op == 0x7D or op == 0x5D or op == 0x8F:  # EMPTY_DICT, EMPTY_LIST, EMPTY_SET
            push(_node())
        elif op in _FILL:
            w.fill(op, pos - 1)
        elif op == 0x73 or op == 0x61:  # SETITEM, APPEND
            w.fill_one(op, pos - 1)
        elif op in _BUILD:
            w.build(op, pos - 1)
        elif op in _LINE_SCALAR:
            end = data.find(b"\n", pos, pos + _MAX_LINE)
            if end < 0:
                raise fail("a text argument has no end of line", pos - 1)
            pos = end + 1
            push(scalar)
        elif op in _PUT:
            pos = w.put(op, pos, pos - 1)
        elif op == 0x2E:  # STOP
            return w.stop(pos)
        else:
            pos = w.other(op, pos, pos - 1)
    raise fail("the pickle ends without its STOP opcode (truncated?)", n)


def _line_int(data: bytes | bytearray, pos: int, at: int, fail: Callable[[str, int], PickleRejected]) -> tuple[int, int]:
    end = data.find(b"\n", pos, pos + 32)
    if end < 0:
        raise fail("a memo index has no end of line", at)
    try:
        return int(data[pos:end]), end + 1
    except ValueError:
        raise fail("a memo index is not a number", at) from None


# ---- the fast path: a C-speed screen of the opcodes, the C load, then a check of what was built ----------
#
# The walk above costs a few times the C load because it runs once per opcode in Python (a 68 MB
# snapshot has 18 M opcodes). Most of what it proves can be had cheaper:
#  * `screen` tokenizes the stream with one regular expression (C speed) and admits only the
#    opcodes protocol 4/5 writes for plain data: no global, no call, no PUT with a chosen memo
#    index (MEMOIZE numbers entries itself, so the memo never outgrows the opcode count), and
#    tuples only of literal scalars, so nothing hashed while loading nests more than one level.
#    Anything else (older protocols, bombs, damage) returns None and goes through `scan`.
#  * the C unpickler then builds the screened stream: with those opcodes it runs no code, and its
#    memory is bounded by the stream's length as for any stream `scan` accepts.
#  * `check_built` measures the result per container at C speed (depth, items per container,
#    expanded object count with shared references counted each time they appear, as `scan`
#    does), so every limit is enforced on exactly what was built.

_LITERAL_OPS = frozenset(b"N\x88\x89JKM\x8aG\x8cC")  # scalar opcodes that take nothing from the stack
_TUPLE_OPS = frozenset(b"\x85\x86\x87t)")


def _one_byte_counted(op: bytes) -> bytes:
    """Regex for opcode `op` followed by a 1-byte length and that many bytes (all 256 cases spelled out)."""
    return re.escape(op) + b"(?:" + b"|".join(re.escape(bytes([k])) + (b".{%d}" % k if k else b"") for k in range(256)) + b")"


class _RunPattern(Protocol):
    """`_patterns()[0]`: `(?:token)*+` matches (maybe the empty string) at every `pos <= endpos`."""

    def match(self, string: bytes | bytearray | memoryview, pos: int, endpos: int, /) -> re.Match[bytes]: ...


@functools.cache
def _patterns() -> tuple[_RunPattern, re.Pattern[bytes]]:
    """(a run of fast tokens, one token); compiled on first use (tens of ms: not at import).

    The run is possessive: no backtracking, it ends at the first byte that does not start a fast
    token. One token (the fast ones and the tuple opcodes) serves to read back a tuple's operands.
    """
    fast = [  # ordered by frequency in real snapshots (the regex tries alternatives in turn)
        b"j.{4}",  # LONG_BINGET
        b"h.",  # BINGET
        b"\\x94",  # MEMOIZE
        _one_byte_counted(b"\x8a"),  # LONG1
        b"K.",  # BININT1
        b"\\(",  # MARK
        b"\\}",  # EMPTY_DICT
        b"u",  # SETITEMS
        _one_byte_counted(b"\x8c"),  # SHORT_BINUNICODE
        b"M..",  # BININT2
        b"J.{4}",  # BININT
        b"\\x95.{8}",  # FRAME
        b"\\]",  # EMPTY_LIST
        b"e",  # APPENDS
        b"a",  # APPEND
        b"s",  # SETITEM
        b"N",  # NONE
        b"\\x88",  # NEWTRUE
        b"\\x89",  # NEWFALSE
        b"G.{8}",  # BINFLOAT
        b"\\x80[\\x02-\\x05]",  # PROTO 2..5
        _one_byte_counted(b"C"),  # SHORT_BINBYTES
    ]
    return (
        cast(_RunPattern, re.compile(b"(?:" + b"|".join(fast) + b")*+", re.S)),
        re.compile(b"|".join(fast) + b"|[\\x85\\x86\\x87t)]", re.S),
    )


@functools.cache
def _run_end() -> Callable[[bytes | bytearray | memoryview, int, int], int]:
    """`run_end(data, pos, end)`: where the run of fast tokens from `pos` stops. The C function
    (`_screen.c`, about 10x faster) where it was built, else the regular expression; the two
    give the same position (tests/test_trace_fast_pickle.py). ALLOCTUNE_SCREEN=python forces
    the regular expression."""
    if os.environ.get("ALLOCTUNE_SCREEN", "").lower() != "python":
        try:
            from alloctune.trace._screen import run_end

            return run_end
        except ImportError:
            pass
    run = _patterns()[0].match
    return lambda data, pos, end: run(data, pos, end).end()


_BYTES_PER_CONTAINER = 16
_DENSE_FROM = 1 << 20  # below this, even a stream of nothing but containers builds < 100 MB
_WINDOW = 1 << 16  # the regex runs window by window, so a tuple's operands are re-read from near it
_OPERAND_SPAN = 2048  # > 3 literal tokens of at most 257 bytes, with MEMOIZEs


class Screened:
    """What `screen` learned: how many tuples the stream builds (all of literal scalars), and empty ones."""

    __slots__ = ("tuples", "empty_tuples")

    def __init__(self) -> None:
        self.tuples = 0
        self.empty_tuples = 0


def screen(data: bytes | bytearray) -> Screened | None:
    """Tokenize `data` at C speed; a `Screened` if every opcode is one the fast path admits, else None.

    None is not a refusal: the caller then runs `scan`, which accepts or refuses with its reasons.

    Besides the opcodes, the density of containers: the C load builds before `check_built` can
    refuse, and an empty list costs 72 bytes for 1 byte of stream. Real snapshots open one container
    per 50-150 bytes; past one per `_BYTES_PER_CONTAINER` (a nesting bomb), a stream of over
    `_DENSE_FROM` bytes goes to `scan`, which refuses bombs before building anything. So the fast
    path never builds much more than a genuine snapshot of the same size would.
    """
    n = len(data)
    if n > _DENSE_FROM and (data.count(b"]") + data.count(b"}")) * _BYTES_PER_CONTAINER > n:
        return None  # (counts bytes, not opcodes: an upper bound on the containers built)
    out = Screened()
    pos = 0
    pure = 0  # start of the current stretch of fast tokens (a token boundary; stops reset it)
    windows = [0]  # token boundaries in that stretch where windows started (the last two)
    run_end = _run_end()
    while True:
        end = min(n, pos + _WINDOW)
        new = run_end(data, pos, end)
        if new > pos and end < n and new >= end - 300:  # stopped by the window, not by an opcode
            pos = new
            windows = [windows[-1], pos]
            continue
        pos = new
        if pos >= n:
            return None  # no STOP
        op = data[pos]
        if op == 0x2E:  # STOP
            if pos + 1 != n and bytes(data[pos + 1 :]).strip(b"\x00\n\r \t"):
                return None  # trailing data: let `scan` word it
            return out
        if op == 0x58 or op == 0x42:  # BINUNICODE, BINBYTES: a 4-byte length
            if pos + 5 > n:
                return None
            pos += 5 + int.from_bytes(data[pos + 1 : pos + 5], "little")
            if pos > n:
                return None
        elif op not in _TUPLE_OPS:
            return None
        else:
            if op == 0x29:  # EMPTY_TUPLE
                out.empty_tuples += 1
            elif _literal_operands(data, op, [pure, *windows], pos):
                out.tuples += 1
            else:
                return None
            pos += 1
        pure = pos
        windows = [pos]


def _literal_operands(data: bytes | bytearray, op: int, bounds: list[int], at: int) -> bool:
    """Whether the tuple built at `at` takes only literal scalars (so it nests one level, never more).

    Tokens are re-read from a known token boundary near `at` (`bounds`: boundaries from which only
    fast tokens lie up to `at`), never from the middle of an argument.
    """
    fast_run, token = _patterns()
    limit = at - _OPERAND_SPAN
    base = max((b for b in bounds if b <= limit), default=None)
    if base is None:
        start = min(bounds)
        if at - start > _OPERAND_SPAN + _WINDOW:  # cannot happen: a window starts at least every _WINDOW bytes
            return False
    else:
        start = fast_run.match(data, base, limit).end()  # the last boundary at or before `limit`
    toks = [m for m in token.finditer(data, start, at) if data[m.start()] != 0x94]  # MEMOIZE takes nothing
    if op == 0x74:  # TUPLE: every item since the last MARK
        marks = [i for i, m in enumerate(toks) if data[m.start()] == 0x28]
        if not marks:
            return False
        items = toks[marks[-1] + 1 :]
    else:
        k = op - 0x84
        if len(toks) < k:
            return False  # an operand lies before the span (a string of 256+ bytes, another tuple, ...)
        items = toks[-k:]
    return all(data[m.start()] in _LITERAL_OPS for m in items)
