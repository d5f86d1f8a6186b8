"""Check data the C unpickler built from a screened stream against `Limits`, at C speed.

Why apart from `pickle_scan`: the screen (there) proves, before anything is built, that the
stream cannot run code or grow the unpickler's memo; what it cannot see without walking every
opcode in Python is the shape (nesting, items per container, the objects a structure expands to
when shared references are counted each time: a "billion laughs"). Here that shape is measured
on what was built, level by level, with a few C-speed passes per level (`map`, `chain`,
`compress`), never one Python step per item, and gives the same count as `pickle_scan.scan`.
"""

from __future__ import annotations

import gc
from collections import Counter
from itertools import chain, compress, groupby, repeat
from operator import eq, is_, is_not, mul, not_, sub
from sys import getrefcount
from typing import Any

from alloctune.trace.limits import Limits

_DICT = dict
_SEQS = (list, tuple)
_CONTAINER_TYPES = frozenset({dict, list, tuple})
_ONLY_DICTS = {dict}
_ITEMS_PER_LEN: dict[type, int] = {dict: 2, list: 1, tuple: 1}  # a dict's keys and values both count


class OverLimit(Exception):
    """`check_built` found the built data over a limit (`scan` then words the refusal)."""


def check_built(root: Any, limits: Limits, nbytes: int, *, tuples: int, empty_tuples: bool, untracked_are_flat: bool) -> int:
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
    if len(seen) == tuples and all(
        map(eq, map(sub, map(getrefcount, seen.values()), map(edges.__getitem__, seen)), repeat(_TUPLE_REFS_HELD))
    ):
        return total
    seen.clear()
    return _measure(root, limits, nbytes, True, untracked_are_flat, None)


def _measure(
    root: Any, limits: Limits, nbytes: int, keys_too: bool, flat: bool, tuple_log: tuple[dict[int, tuple], Counter] | None
) -> int:
    """The expanded object count of `root`, level by level; `OverLimit` past a limit.

    A level: the dicts and the lists/tuples that appear once (`dicts`, `seqs`), and the others with
    their number of appearances (`hobjs`, `hweights`)."""
    kind = type(root)
    if kind not in _CONTAINER_TYPES:
        return 1
    max_depth, max_len, max_objects = limits.max_depth, limits.max_container, limits.objects_allowed(nbytes)
    dicts, seqs = ([root], []) if kind is dict else ([], [root])
    hobjs: list = []
    hweights: list[int] = []
    total = 1
    depth = 0
    while dicts or seqs or hobjs:
        depth += 1
        if depth > max_depth:
            raise OverLimit(f"containers nest deeper than {max_depth} levels")
        total = _count_items(dicts, seqs, hobjs, hweights, total, max_len, max_objects)
        if flat and dicts:
            dicts = list(compress(dicts, map(gc.is_tracked, dicts)))
        leaves = _Leaves()
        found = _containers_in(seqs, dicts, keys_too, flat, leaves, 1, max_len)
        del dicts, seqs
        if tuple_log is not None:
            _log_tuples(tuple_log, found[2])
        counts, distinct = _below_shared(hobjs, hweights, keys_too, flat, leaves, max_len, tuple_log)
        del hobjs, hweights
        total = _count_leaves(leaves, depth, total, max_depth, max_len, max_objects)
        dicts, seqs = _appearing_once(found, counts, distinct)  # also moves the others into counts/distinct
        del found
        hobjs, hweights = _next_level(dicts, seqs, counts, distinct)
        del counts, distinct
    return total


def _count_items(dicts: list, seqs: list, hobjs: list, hweights: list[int], total: int, max_len: int, max_objects: int) -> int:
    """`total` plus the items of this level's containers (a dict's keys and values both count, a
    container appearing w times counts w times); `OverLimit` for a container or a total too large."""
    dlens = list(map(len, dicts))
    slens = list(map(len, seqs))
    hitems = list(map(mul, map(len, hobjs), map(_ITEMS_PER_LEN.__getitem__, map(type, hobjs))))
    if max(2 * max(dlens, default=0), max(slens, default=0), max(hitems, default=0)) > max_len:
        raise OverLimit(f"a container holds more than {max_len} items")
    total += 2 * sum(dlens) + sum(slens) + sum(map(mul, hitems, hweights))
    if total > max_objects:
        raise OverLimit(f"the data expands to more than {max_objects} objects")
    return total


def _log_tuples(tuple_log: tuple[dict[int, tuple], Counter], tuples: list) -> None:
    """Note each tuple found (once per appearance), for `check_built`'s account of the tuples built."""
    if tuples:
        ids = list(map(id, tuples))
        tuple_log[0].update(zip(ids, tuples))
        tuple_log[1].update(ids)


def _below_shared(
    hobjs: list,
    hweights: list[int],
    keys_too: bool,
    flat: bool,
    leaves: _Leaves,
    max_len: int,
    tuple_log: tuple[dict[int, tuple], Counter] | None,
) -> tuple[Counter, dict[int, Any]]:
    """(appearances by id, the containers by id) of the containers inside the containers that
    appear several times: each group of equal weight walked once, its finds counted that often."""
    counts: Counter = Counter()
    distinct: dict[int, Any] = {}
    order = sorted(range(len(hobjs)), key=hweights.__getitem__)  # C-speed grouping by appearances
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
            _log_tuples(tuple_log, [x for x in occ if type(x) is tuple])
    return counts, distinct


def _count_leaves(leaves: _Leaves, depth: int, total: int, max_depth: int, max_len: int, max_objects: int) -> int:
    """`total` plus the items of the dicts of scalars found one level down (nothing lies below them)."""
    if leaves.largest < 0:
        return total
    if depth + 1 > max_depth:
        raise OverLimit(f"containers nest deeper than {max_depth} levels")
    if leaves.largest > max_len:
        raise OverLimit(f"a container holds more than {max_len} items")
    total += leaves.items
    if total > max_objects:
        raise OverLimit(f"the data expands to more than {max_objects} objects")
    return total


def _appearing_once(found: list[list], counts: Counter, distinct: dict[int, Any]) -> tuple[list, list]:
    """(dicts, lists and tuples) among `found` that nothing else references (read from their
    reference counts, see `_ONCE`); the others go to `counts`/`distinct`, counted by identity."""
    dicts: list = []
    seqs: list = []
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
    return dicts, seqs


def _next_level(dicts: list, seqs: list, counts: Counter, distinct: dict[int, Any]) -> tuple[list, list[int]]:
    """The containers counted by identity that appear once after all join `dicts`/`seqs`; the rest
    are the next level's (containers, appearances)."""
    objs = list(distinct.values())
    weights = list(map(counts.__getitem__, distinct))
    single = list(map(eq, weights, repeat(1)))
    if any(single):  # appear once after all (referenced from another level too)
        again = list(compress(objs, single))
        is_dict = list(map(is_, map(type, again), repeat(_DICT)))
        dicts.extend(compress(again, is_dict))
        seqs.extend(compress(again, map(not_, is_dict)))
    return list(compress(objs, map(not_, single))), list(compress(weights, map(not_, single)))


class _Leaves:
    """Untracked dicts found as items (when `flat`): they hold only scalars, so only their sizes matter."""

    __slots__ = ("items", "largest")

    def __init__(self) -> None:
        self.items = 0  # keys and values, summed over every appearance
        self.largest = -1  # items of the largest; -1: none found


def _containers_in(
    seqs: list, dicts: list, keys_too: bool, flat: bool, leaves: _Leaves | None = None, weight: int = 1, max_len: int = 0
) -> list[list]:
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
            these = (
                list(compress(got, map(is_, kinds, repeat(kind)))) if len(set(kinds)) > 1 else (got if kinds[0] is kind else [])
            )
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
    parent: list[list[object]] = [[]]
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
