"""The snapshot's annotated ranges on the request stream: which requests each range holds.

Torch writes `external_annotations` for the optimizer's steps by default and for the user's
`record_function` ranges; `collect_annotations` checks them (untrusted input, bounded) and
places each range on `RequestStream.annotations` by the events' times.
"""

from __future__ import annotations

from typing import Any, Sequence, cast

from alloctune.errors import TraceError
from alloctune.trace.model import MAX_ANNOTATION_NAME, MAX_ANNOTATIONS, Annotation, RequestStream


def collect_annotations(
    raw: Any, events: Sequence[dict[str, Any]], req: RequestStream, device: int, source: str = "<trace>"
) -> None:
    """Place the snapshot's `external_annotations` on the request stream (`RequestStream.annotations`).

    Torch writes one entry per range edge: `{"device", "name", "stage": "START" | "END", "time_us"}`,
    from the thread that ran the range (record_function is thread-local). A range holds the requests
    whose event time lies within its edges. Nested ranges of one name pair innermost first; a START
    with no END (the run ended inside it, an OOM say) lasts to the end; an END with no START (the
    ring buffer dropped it) is left out. Untrusted input: an entry of the wrong shape is a
    `TraceError` (one line), and more than `MAX_ANNOTATIONS` entries are refused.
    """
    if raw is None:
        return
    if not isinstance(raw, list):
        raise TraceError(f"{source}: 'external_annotations' is not a list; the snapshot is damaged")
    if len(raw) > MAX_ANNOTATIONS:
        raise TraceError(
            f"{source}: more than {MAX_ANNOTATIONS} external annotations; the snapshot is not one "
            "program's (alloctune keeps its memory bounded)"
        )
    edges: list[tuple[int, str, bool]] = []
    for k, a in enumerate(raw):
        if not isinstance(a, dict):
            raise TraceError(f"{source}: external_annotations[{k}] is not a dict; the snapshot is damaged")
        name, stage, t, dev = a.get("name"), a.get("stage"), a.get("time_us"), a.get("device", device)
        if (
            type(name) is not str
            or len(name) > MAX_ANNOTATION_NAME
            or stage not in ("START", "END")
            or type(t) is not int
            or type(dev) is not int
        ):
            raise TraceError(
                f"{source}: external_annotations[{k}] is not {{name: str (at most "
                f"{MAX_ANNOTATION_NAME} characters), stage: START|END, time_us: int, device: int}}"
            )
        if dev == device:
            edges.append((t, name, stage == "START"))
    if not edges:
        return
    raw_times = [events[i].get("time_us") if 0 <= i < len(events) else None for i in req.event_index]
    if any(type(t) is not int for t in raw_times):
        return  # a history without times: nothing places a range
    times = cast("list[int]", raw_times)  # every one checked just above
    import bisect

    n = len(times)
    open_at: dict[str, list[int]] = {}
    out: list[Annotation] = []
    for t, name, start in sorted(edges, key=lambda e: (e[0], not e[2])):
        if start:
            open_at.setdefault(name, []).append(bisect.bisect_left(times, t))
        elif open_at.get(name):
            out.append(Annotation(name, open_at[name].pop(), bisect.bisect_right(times, t)))
    out += [Annotation(name, s, n) for name, starts in open_at.items() for s in starts]
    out.sort(key=lambda a: (a.start, -a.end))
    req.annotations = out
