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
import gc
import re
import struct
from collections import Counter
from itertools import chain, compress, groupby, repeat
from operator import eq, is_, is_not, mul, not_, sub
from sys import getrefcount
from typing import Any

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
_FORBIDDEN = {ord("R"): "REDUCE", ord("b"): "BUILD", ord("o"): "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX",
              0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER"}
# Fixed-size scalar opcodes: opcode -> argument bytes.
_FIXED_SCALAR = {ord("N"): 0, 0x88: 0, 0x89: 0, ord("K"): 1, ord("M"): 2, ord("J"): 4, ord("G"): 8}
# Length-prefixed scalars: opcode -> bytes of the length field.
_COUNTED_SCALAR = {0x8C: 1, ord("C"): 1, ord("U"): 1, 0x8A: 1, ord("X"): 4, ord("B"): 4, ord("T"): 4,
                   0x8B: 4, 0x8D: 8, 0x8E: 8, 0x96: 8}
# Newline-terminated scalars (protocol 0).
_LINE_SCALAR = frozenset(b"IFLSV")
_MAX_LINE = 1 << 16
_U32 = struct.Struct("<I").unpack_from


def _node() -> list:
    """A container's shape: [depth, expanded objects, direct length, sealed]."""
    return [1, 1, 0, False]


def scan(data: bytes, limits: Limits | None = None) -> int:
    """Walk `data`; return the expanded object count of the result, or raise.

    Raises `PickleRejected` (a `TraceError`) naming the opcode and byte offset, or
    `NeedsGlobal` when the stream names a global (the caller re-runs the restricted
    unpickler, which refuses it with the global's name).
    """
    lim = limits or Limits.from_env()
    n = len(data)
    max_depth = lim.max_depth
    max_len = lim.max_container
    max_objects = lim.objects_allowed(n)
    max_memo = n  # a genuine memo index never exceeds the number of objects, so never the byte count
    stack: list = []
    marks: list[int] = []
    memo: dict[int, object] = {}
    memo_count = 0
    pos = 0
    fixed = _FIXED_SCALAR
    counted = _COUNTED_SCALAR
    scalar = _SCALAR

    def fail(what: str, at: int) -> PickleRejected:
        return PickleRejected(f"{what} (at byte {at})")

    def add(parent: list, child, at: int) -> None:
        """Account for `child` becoming an item of container `parent`."""
        if parent[3]:
            raise fail("a container is modified after it was stored inside another one; not plain data", at)
        if child is not scalar:
            if child is parent:
                raise fail("a container contains itself (a cycle); not plain data", at)
            child[3] = True
            d = child[0] + 1
            if d > parent[0]:
                if d > max_depth:
                    raise fail(f"containers nest deeper than {max_depth} levels; {hint('max_depth')}", at)
                parent[0] = d
            parent[1] += child[1]
        else:
            parent[1] += 1
        parent[2] += 1
        if parent[2] > max_len:
            raise fail(f"a container holds more than {max_len} items; {hint('max_container')}", at)
        if parent[1] > max_objects:
            raise fail(f"the data expands to more than {max_objects} objects (shared references counted each "
                       f"time; a 'billion laughs'?); {hint('max_objects')}", at)

    def pop_mark(at: int) -> int:
        if not marks:
            raise fail("an opcode needs a MARK that is not there", at)
        return marks.pop()

    def sealed_tuple(items: list, at: int) -> list:
        t = _node()
        for it in items:
            add(t, it, at)
        t[3] = True  # tuples are immutable
        return t

    push = stack.append
    u32 = _U32
    while pos < n:
        op = data[pos]
        pos += 1
        # --- the hot opcodes of a snapshot first (a third of all opcodes are LONG_BINGET) -------
        if op == 0x6A:  # LONG_BINGET
            try:
                push(memo[u32(data, pos)[0]])
            except (KeyError, struct.error):
                raise fail("LONG_BINGET of a memo index that was never stored", pos - 1) from None
            pos += 4
            continue
        at = pos - 1
        if op == 0x68:  # BINGET
            if pos >= n:
                break
            idx = data[pos]
            pos += 1
            try:
                push(memo[idx])
            except KeyError:
                raise fail(f"memo index {idx} was never stored", at) from None
        elif op == 0x94:  # MEMOIZE
            if not stack:
                raise fail("MEMOIZE on an empty stack", at)
            memo[memo_count] = stack[-1]
            memo_count = len(memo)
        elif op in fixed:
            pos += fixed[op]
            push(scalar)
        elif op in counted:
            width = counted[op]
            size = int.from_bytes(data[pos:pos + width], "little")
            pos += width + size
            if pos > n:
                raise fail(f"a {size}-byte value runs past the end of the data (truncated?)", at)
            stack.append(scalar)
        elif op == 0x28:  # MARK
            marks.append(len(stack))
        elif op == 0x7D or op == 0x5D or op == 0x8F:  # EMPTY_DICT, EMPTY_LIST, EMPTY_SET
            stack.append(_node())
        elif op == 0x75 or op == 0x65 or op == 0x90:  # SETITEMS, APPENDS, ADDITEMS
            k = pop_mark(at)
            if k == 0 or k > len(stack):
                raise fail("no container below the MARK", at)
            parent = stack[k - 1]
            if parent is scalar:
                raise fail("items added to something that is not a container", at)
            items = stack[k:]
            del stack[k:]
            if op == 0x75 and len(items) % 2:
                raise fail("SETITEMS with an odd number of items", at)
            plain = items.count(scalar)
            if plain == len(items) and not parent[3]:  # the common case: a dict of scalars
                parent[1] += plain
                parent[2] += plain
                if parent[2] > max_len or parent[1] > max_objects:
                    add(parent, scalar, at)  # raises with the message
            else:
                for it in items:
                    add(parent, it, at)
        elif op == 0x73 or op == 0x61:  # SETITEM, APPEND
            need = 3 if op == 0x73 else 2
            if len(stack) - (marks[-1] if marks else 0) < need:
                raise fail("stack underflow", at)
            parent = stack[-need]
            if parent is scalar:
                raise fail("items added to something that is not a container", at)
            for it in stack[1 - need:]:
                add(parent, it, at)
            del stack[1 - need:]
        elif op == 0x85 or op == 0x86 or op == 0x87:  # TUPLE1..3
            k = op - 0x84
            if len(stack) - (marks[-1] if marks else 0) < k:
                raise fail("stack underflow", at)
            items = stack[-k:]
            del stack[-k:]
            stack.append(sealed_tuple(items, at))
        elif op == 0x29:  # EMPTY_TUPLE
            stack.append(sealed_tuple([], at))
        elif op == 0x74 or op == 0x6C or op == 0x64 or op == 0x91:  # TUPLE, LIST, DICT, FROZENSET
            k = pop_mark(at)
            items = stack[k:]
            del stack[k:]
            if op == 0x64 and len(items) % 2:
                raise fail("DICT with an odd number of items", at)
            node = sealed_tuple(items, at) if op in (0x74, 0x91) else _node()
            if op in (0x6C, 0x64):
                for it in items:
                    add(node, it, at)
            stack.append(node)
        elif op in _LINE_SCALAR:
            end = data.find(b"\n", pos, pos + _MAX_LINE)
            if end < 0:
                raise fail("a text argument has no end of line", at)
            pos = end + 1
            stack.append(scalar)
        elif op == 0x71:  # BINPUT
            if not stack or pos >= n:
                raise fail("BINPUT on an empty stack", at)
            memo[data[pos]] = stack[-1]
            pos += 1
            memo_count = len(memo)
        elif op == 0x72 or op == 0x70:  # LONG_BINPUT, PUT
            if op == 0x72:
                if pos + 4 > n:
                    raise fail("LONG_BINPUT runs past the end of the data", at)
                idx = u32(data, pos)[0]
                pos += 4
            else:
                idx, pos = _line_int(data, pos, at, fail)
            if not stack:
                raise fail("PUT on an empty stack", at)
            if idx >= max_memo:
                raise fail(f"memo index {idx} is larger than the file could ever need; a memory bomb", at)
            memo[idx] = stack[-1]
            memo_count = len(memo)
        elif op == 0x67:  # GET
            idx, pos = _line_int(data, pos, at, fail)
            try:
                stack.append(memo[idx])
            except KeyError:
                raise fail(f"memo index {idx} was never stored", at) from None
        elif op == 0x30:  # POP
            if stack and (not marks or len(stack) > marks[-1]):
                stack.pop()
            elif marks:
                marks.pop()
            else:
                raise fail("POP on an empty stack", at)
        elif op == 0x31:  # POP_MARK
            del stack[pop_mark(at):]
        elif op == 0x32:  # DUP
            if not stack:
                raise fail("DUP on an empty stack", at)
            stack.append(stack[-1])
        elif op == 0x80:  # PROTO
            if pos >= n or data[pos] > 5:
                raise fail("unsupported pickle protocol", at)
            pos += 1
        elif op == 0x95:  # FRAME: only a length hint
            pos += 8
        elif op == 0x2E:  # STOP
            if len(stack) != 1 or marks:
                raise fail("STOP with a malformed stack", at)
            if pos != n and data[pos:].strip(b"\x00\n\r \t"):
                raise fail(f"{n - pos} byte(s) of trailing data after the pickle", pos)
            top = stack[0]
            return 1 if top is scalar else top[1]
        elif op in _GLOBALISH:
            raise NeedsGlobal(at)
        elif op in _FORBIDDEN:
            raise fail(f"opcode {_FORBIDDEN[op]} calls code; a memory snapshot never uses it", at)
        else:
            raise fail(f"unknown opcode 0x{op:02x}", at)
    raise fail("the pickle ends without its STOP opcode (truncated?)", n)


def _line_int(data: bytes, pos: int, at: int, fail) -> tuple[int, int]:
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
    return re.escape(op) + b"(?:" + b"|".join(re.escape(bytes([k])) + (b".{%d}" % k if k else b"")
                                              for k in range(256)) + b")"


@functools.cache
def _patterns() -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
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
    return (re.compile(b"(?:" + b"|".join(fast) + b")*+", re.S),
            re.compile(b"|".join(fast) + b"|[\\x85\\x86\\x87t)]", re.S))


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


def screen(data: bytes | bytearray | memoryview) -> Screened | None:
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
    run = _patterns()[0].match
    while True:
        end = min(n, pos + _WINDOW)
        new = run(data, pos, end).end()
        if new > pos and end < n and new >= end - 300:  # stopped by the window, not by an opcode
            pos = new
            windows = [windows[-1], pos]
            continue
        pos = new
        if pos >= n:
            return None  # no STOP
        op = data[pos]
        if op == 0x2E:  # STOP
            if pos + 1 != n and bytes(data[pos + 1:]).strip(b"\x00\n\r \t"):
                return None  # trailing data: let `scan` word it
            return out
        if op == 0x58 or op == 0x42:  # BINUNICODE, BINBYTES: a 4-byte length
            if pos + 5 > n:
                return None
            pos += 5 + int.from_bytes(data[pos + 1:pos + 5], "little")
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


def _literal_operands(data, op: int, bounds: list[int], at: int) -> bool:
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
        items = toks[marks[-1] + 1:]
    else:
        k = op - 0x84
        if len(toks) < k:
            return False  # an operand lies before the span (a string of 256+ bytes, another tuple, ...)
        items = toks[-k:]
    return all(data[m.start()] in _LITERAL_OPS for m in items)


_DICT = dict
_SEQS = (list, tuple)
_CONTAINER_TYPES = frozenset({dict, list, tuple})
_ONLY_DICTS = {dict}
_ITEMS_PER_LEN = {dict: 2, list: 1, tuple: 1}  # a dict's keys and values both count


class OverLimit(Exception):
    """`check_built` found the built data over a limit (`scan` then words the refusal)."""


def check_built(root: Any, limits: Limits, nbytes: int, *, tuples: int, empty_tuples: bool,
                untracked_are_flat: bool) -> int:
    """Enforce `limits` on data the C unpickler built from a screened stream; the expanded object count.

    Level by level from the root, a few C-speed passes per level (`map`, `chain`, `compress`), never
    one Python step per item. A container that appears several times is visited once per level with
    a weight (its number of appearances), so the count is the one `scan` computes (every appearance
    counted) in time linear in the distinct containers; a cycle ends at the depth limit. Which
    containers appear once is read from their reference counts (one from their parent, see `_ONCE`):
    any other reference only sends a container to the exact count by identity.

    `tuples`, `empty_tuples`: what `screen` counted. Dict keys can only be containers if the stream
    builds tuples; rather than look at every key, the walk first looks at values only and then
    accounts for every tuple the stream built: if each is found, and referenced exactly as often as
    the walk found it, none is a key (a key would hold one more reference); otherwise it walks again,
    keys included. `untracked_are_flat`: a dict the garbage collector does not track holds only
    scalars (true when no tuple can have been untracked, see `safe_pickle`), so its items need no look.
    Raises `OverLimit` naming the limit.
    """
    if not tuples or empty_tuples:  # `()` is one shared object: account for it by looking at keys
        return _measure(root, limits, nbytes, tuples > 0 or empty_tuples, untracked_are_flat, None)
    seen: dict[int, tuple] = {}
    edges: Counter = Counter()
    total = _measure(root, limits, nbytes, False, untracked_are_flat, (seen, edges))
    if len(seen) == tuples and all(map(eq, map(sub, map(getrefcount, seen.values()), map(edges.__getitem__, seen)),
                                       repeat(_TUPLE_REFS_HELD))):
        return total
    seen.clear()
    return _measure(root, limits, nbytes, True, untracked_are_flat, None)


def _measure(root: Any, limits: Limits, nbytes: int, keys_too: bool, flat: bool,
             tuple_log: tuple[dict[int, tuple], Counter] | None) -> int:
    kind = type(root)
    if kind not in _CONTAINER_TYPES:
        return 1
    max_depth = limits.max_depth
    max_len = limits.max_container
    max_objects = limits.objects_allowed(nbytes)
    # A level: the dicts and the lists/tuples that appear once, and the others with their appearances.
    dicts, seqs = ([root], []) if kind is dict else ([], [root])
    hobjs: list = []
    hweights: list[int] = []
    total = 1
    depth = 0
    while dicts or seqs or hobjs:
        depth += 1
        if depth > max_depth:
            raise OverLimit(f"containers nest deeper than {max_depth} levels")
        dlens = list(map(len, dicts))
        slens = list(map(len, seqs))
        hitems = list(map(mul, map(len, hobjs), map(_ITEMS_PER_LEN.__getitem__, map(type, hobjs))))
        if max(2 * max(dlens, default=0), max(slens, default=0), max(hitems, default=0)) > max_len:
            raise OverLimit(f"a container holds more than {max_len} items")
        total += 2 * sum(dlens) + sum(slens) + sum(map(mul, hitems, hweights))
        if total > max_objects:
            raise OverLimit(f"the data expands to more than {max_objects} objects")
        del dlens, slens, hitems
        if flat and dicts:
            dicts = list(compress(dicts, map(gc.is_tracked, dicts)))
        leaves = _Leaves()
        found = _containers_in(seqs, dicts, keys_too, flat, leaves, 1, max_len)
        del dicts, seqs
        if tuple_log is not None and found[2]:
            ids = list(map(id, found[2]))
            tuple_log[0].update(zip(ids, found[2]))
            tuple_log[1].update(ids)
        counts: Counter = Counter()
        distinct: dict[int, Any] = {}
        # containers that appear several times, by their number of appearances (C-speed grouping)
        order = sorted(range(len(hobjs)), key=hweights.__getitem__)
        for w, grp in groupby(order, key=hweights.__getitem__):
            group = list(map(hobjs.__getitem__, grp))
            gd = list(compress(group, map(is_, map(type, group), repeat(_DICT))))
            if flat and gd:
                gd = list(compress(gd, map(gc.is_tracked, gd)))
            gs = list(compress(group, map(is_not, map(type, group), repeat(_DICT)))) if len(gd) != len(group) else []
            occ = [x for part in _containers_in(gs, gd, keys_too, flat, leaves, w, max_len) for x in part]  # noqa: C416
            if not occ:
                continue
            ids = list(map(id, occ))
            distinct.update(zip(ids, occ))
            per = Counter(ids)
            if w == 1:
                counts.update(per)
            else:
                for k, c in per.items():
                    counts[k] += c * w
            if tuple_log is not None:
                tups = [x for x in occ if type(x) is tuple]
                ids = list(map(id, tups))
                tuple_log[0].update(zip(ids, tups))
                tuple_log[1].update(ids)
        del hobjs, hweights, order
        if leaves.largest >= 0:  # dicts of scalars one level down: counted here, nothing below them
            if depth + 1 > max_depth:
                raise OverLimit(f"containers nest deeper than {max_depth} levels")
            if leaves.largest > max_len:
                raise OverLimit(f"a container holds more than {max_len} items")
            total += leaves.items
            if total > max_objects:
                raise OverLimit(f"the data expands to more than {max_objects} objects")
        dicts, seqs = [], []
        for i, part in enumerate(found):
            refs = list(map(getrefcount, part))
            if max(refs, default=_ONCE) > _ONCE:  # some appear elsewhere too
                once = list(map(eq, refs, repeat(_ONCE)))
                shared = list(compress(part, map(not_, once)))
                part = list(compress(part, once))
                del once
                ids = list(map(id, shared))
                distinct.update(zip(ids, shared))
                counts.update(ids)
                del shared, ids
            del refs
            if i == 0:
                dicts = part
            elif seqs:
                seqs.extend(part)
            else:
                seqs = part
        del found
        objs = list(distinct.values())
        weights = list(map(counts.__getitem__, distinct))
        del distinct, counts
        single = list(map(eq, weights, repeat(1)))
        if any(single):  # appear once after all (referenced from another level too)
            again = list(compress(objs, single))
            is_dict = list(map(is_, map(type, again), repeat(_DICT)))
            dicts.extend(compress(again, is_dict))
            seqs.extend(compress(again, map(not_, is_dict)))
            del again, is_dict
        hobjs = list(compress(objs, map(not_, single)))
        hweights = list(compress(weights, map(not_, single)))
        del objs, weights, single
    return total


class _Leaves:
    """Untracked dicts found as items (when `flat`): they hold only scalars, so only their sizes matter."""

    __slots__ = ("items", "largest")

    def __init__(self) -> None:
        self.items = 0  # keys and values, summed over every appearance
        self.largest = -1  # items of the largest; -1: none found


def _containers_in(seqs: list, dicts: list, keys_too: bool, flat: bool, leaves: _Leaves | None = None,
                   weight: int = 1, max_len: int = 0) -> list[list]:
    """[dicts, lists, tuples] among the items of `seqs` and the values (and keys if `keys_too`) of
    `dicts`, each once per appearance; `dicts` must be only the tracked ones if `flat`, and then
    untracked dicts found are not returned but added to `leaves` (times `weight`; `leaves.largest`
    is exact only when over `max_len`, a bound otherwise)."""
    out: list[list] = [[], [], []]
    sources = []  # (a function giving a fresh iterator over the items, whether to look at their types first)
    if seqs:  # lists are often all dicts (events, frames): worth a first look
        sources.append((lambda: chain.from_iterable(seqs), True))
    if dicts:  # the values of tracked dicts: some are containers, most are not
        sources.append((lambda: chain.from_iterable(map(_DICT.values, dicts)), False))
        if keys_too:
            sources.append((lambda: chain.from_iterable(dicts), True))
    for items, look_first in sources:
        if look_first:
            present = set(map(type, items()))
            if present.isdisjoint(_CONTAINER_TYPES):
                continue
            if flat and leaves is not None and present == _ONLY_DICTS:  # e.g. the frame lists of a snapshot
                if not any(map(gc.is_tracked, items())):  # all dicts of scalars: their sizes suffice
                    n = 2 * sum(map(len, items()))
                    leaves.items += n * weight
                    # the largest only matters if it could be over the limit (saves a pass)
                    leaves.largest = max(leaves.largest, 2 * max(map(len, items())) if n > max_len else n)
                    continue
        got = list(compress(items(), map(_CONTAINER_TYPES.__contains__, map(type, items()))))
        if not got:
            continue
        kinds = list(map(type, got))
        for slot, kind in enumerate((dict, list, tuple)):
            these = list(compress(got, map(is_, kinds, repeat(kind)))) if len(set(kinds)) > 1 else (
                got if kinds[0] is kind else [])
            if not these:
                continue
            if slot == 0 and flat and leaves is not None:
                tracked = list(map(gc.is_tracked, these))
                if not all(tracked):
                    sizes = list(map(len, compress(these, map(not_, tracked))))
                    leaves.items += 2 * sum(sizes) * weight
                    leaves.largest = max(leaves.largest, 2 * max(sizes))
                    these = list(compress(these, tracked))
            out[slot].extend(these)
    return out


def _refs_of_an_only_child() -> int:
    """`getrefcount` of a container referenced once in the data, as `check_built` reads it."""
    parent = [[]]
    found = _containers_in([parent], [], False, False)[1]
    return list(map(getrefcount, found))[0]


_ONCE = _refs_of_an_only_child()


def _refs_held_by_the_log() -> int:
    """References to a tuple beyond its structural ones while `check_built` reads its tuple log."""
    t = tuple([1, 2])  # built at run time: a literal would also be held by the code object
    seen = {id(t): t}
    del t
    return list(map(getrefcount, seen.values()))[0]


_TUPLE_REFS_HELD = _refs_held_by_the_log()
