"""The Python stacks of a recording's allocations: each ALLOC request's stack id and the table of
distinct stacks and frames (`RequestStream.stack_ids`, `stack_table`), read from the events' frames.

Part of building the request stream (`trace.stream.build_stream` calls `collect_stacks`); the
simulator never reads it, explain and the fallible-request model do.
"""

from __future__ import annotations

from typing import Any, Sequence

from alloctune.trace.model import ALLOC, MAX_FRAMES, MAX_FRAMES_PER_STACK, MAX_STACKS, RequestStream, StackTable


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
    stack_of: dict[tuple[int, ...], int] = {}  # a stack's frame ids -> its id
    frame_of: dict[tuple, int] = {}  # (filename, line, name) -> its frame id
    # torch's snapshot shares one dict among the frames of one line (a few hundred objects for
    # millions of frames), so a stack is first looked up by its frames' objects, and each object's
    # content is read once; they all live in `events` meanwhile, so their ids are theirs alone.
    # Ids still follow the content, in order of first appearance.
    stack_of_objects: dict[tuple[int, ...], int] = {}
    frame_of_object: dict[int, int] = {}
    try:
        for r, op in enumerate(ops):
            if op != ALLOC:
                continue
            frames = events[evi[r]].get("frames")
            if not frames:
                continue
            if type(frames) is not list or len(frames) > MAX_FRAMES_PER_STACK:
                raise ValueError(f"event {evi[r]}: 'frames' is not a list of at most {MAX_FRAMES_PER_STACK} frames")
            objects = tuple(map(id, frames))
            sid = stack_of_objects.get(objects)
            if sid is None:
                fids = tuple(_frame_id(f, frame_of_object, frame_of, table, evi[r]) for f in frames)
                sid = stack_of.get(fids)
                if sid is None:
                    sid = stack_of[fids] = len(table.stacks)
                    table.stacks.append(fids)
                    if len(table.stacks) > MAX_STACKS or len(table.frames) > MAX_FRAMES:
                        raise ValueError(f"more than {MAX_STACKS} distinct stacks or {MAX_FRAMES} distinct frames")
                stack_of_objects[objects] = sid
            ids[r] = sid
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        req.stack_ids = [-1] * len(ops)
        req.stack_table = StackTable(dropped=f"stacks not kept: {exc if isinstance(exc, ValueError) else 'malformed frames'}")
        return
    req.stack_ids = ids
    req.stack_table = table


def _frame_id(frame: dict[str, Any], seen: dict[int, int], frame_of: dict[tuple, int], table: StackTable, event: int) -> int:
    """The id of `frame`'s content (new ones appended to `table.frames`); `seen` keeps it by object."""
    fid = seen.get(id(frame))
    if fid is None:
        fr = (frame["filename"], frame["line"], frame["name"])
        if type(fr[0]) is not str or type(fr[1]) is not int or type(fr[2]) is not str:
            raise ValueError(f"event {event}: a frame is not (filename: str, line: int, name: str)")
        fid = frame_of.get(fr)
        if fid is None:
            fid = frame_of[fr] = len(table.frames)
            table.frames.append(fr)
        seen[id(frame)] = fid
    return fid
