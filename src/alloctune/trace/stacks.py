"""The Python stacks of a recording's allocations: each ALLOC request's stack id and the table of
distinct stacks and frames (`RequestStream.stack_ids`, `stack_table`), read from the events' frames.

Part of building the request stream (`trace.stream.build_stream` calls `collect_stacks`); the
simulator never reads it, explain and the fallible-request model do.
"""

from __future__ import annotations

from typing import Any, Sequence

from alloctune.trace.model import ALLOC, MAX_FRAMES, MAX_FRAMES_PER_STACK, MAX_STACKS, RequestStream, StackTable

# Known stacks met again in frame objects of their own, after which lookups by object stop.
UNSHARED = 1000


def collect_stacks(events: Sequence[dict[str, Any]], req: RequestStream) -> None:
    """Give each ALLOC request the id of its Python stack (`RequestStream.stack_ids`, `stack_table`).

    Only when the recording kept frames (`_record_memory_history(stacks="python")`); a recording
    without any leaves both None at the cost of one scan. The frames come from untrusted files:
    a malformed frame list or more stacks than `MAX_STACKS` drops the table (with the reason in
    `StackTable.dropped`) rather than failing the load, because replay does not need it.
    """
    ops, evi = req.ops, req.event_index
    n = len(events)
    if not any(ops[r] == ALLOC and 0 <= evi[r] < n and events[evi[r]].get("frames") for r in range(len(ops))):
        return
    table = StackTable()
    ids = [-1] * len(ops)
    stack_of: dict[tuple, int] = {}  # a stack's ((filename, line, name), ...) -> its id
    frame_of: dict[tuple, int] = {}  # (filename, line, name) -> its frame id
    # torch's snapshots share one dict among the frames of one line (a few hundred objects for
    # millions of frames), so a stack is first looked up by its frames' objects (they all live in
    # `events` meanwhile: their ids are theirs alone), its content read only when that misses.
    # A file that repeats known stacks in new objects turns the lookup off after `UNSHARED` of them.
    by_objects: dict[tuple[int, ...], int] | None = {}
    unshared = 0
    try:
        for r, op in enumerate(ops):
            if op != ALLOC:
                continue
            frames = events[evi[r]].get("frames")
            if not frames:
                continue
            if type(frames) is not list or len(frames) > MAX_FRAMES_PER_STACK:
                raise ValueError(f"event {evi[r]}: 'frames' is not a list of at most {MAX_FRAMES_PER_STACK} frames")
            objects = tuple(map(id, frames)) if by_objects is not None else ()
            sid = by_objects.get(objects) if by_objects is not None else None
            if sid is None:
                key = tuple((f["filename"], f["line"], f["name"]) for f in frames)
                sid = stack_of.get(key)
                if sid is None:
                    sid = stack_of[key] = _new_stack(key, table, frame_of, evi[r])
                elif by_objects is not None:
                    unshared += 1
                    if unshared > UNSHARED:
                        by_objects = None
                if by_objects is not None:
                    by_objects[objects] = sid
            ids[r] = sid
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        req.stack_ids = [-1] * len(ops)
        req.stack_table = StackTable(dropped=f"stacks not kept: {exc if isinstance(exc, ValueError) else 'malformed frames'}")
        return
    req.stack_ids = ids
    req.stack_table = table


def _new_stack(key: tuple, table: StackTable, frame_of: dict[tuple, int], event: int) -> int:
    """Append the stack `key` (its frames first, where new) to `table`; its id."""
    fids = []
    for fr in key:
        if type(fr[0]) is not str or type(fr[1]) is not int or type(fr[2]) is not str:
            raise ValueError(f"event {event}: a frame is not (filename: str, line: int, name: str)")
        fid = frame_of.get(fr)
        if fid is None:
            fid = frame_of[fr] = len(table.frames)
            table.frames.append(fr)
        fids.append(fid)
    table.stacks.append(tuple(fids))
    if len(table.stacks) > MAX_STACKS or len(table.frames) > MAX_FRAMES:
        raise ValueError(f"more than {MAX_STACKS} distinct stacks or {MAX_FRAMES} distinct frames")
    return len(table.stacks) - 1
