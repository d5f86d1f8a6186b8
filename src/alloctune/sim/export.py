"""A simulated run written as a torch memory snapshot, for the viewer people already use.

`alloctune simulate REC --conf X --budget B --snapshot-out FILE` shows the "after" picture of a
recommendation in PyTorch's own memory_viz (pytorch.org/memory_viz, `torch.cuda._memory_viz`): the
history of the simulated allocator (`device_traces`: alloc / free_requested / free_completed /
segment_* / oom, each allocation with the Python frames its recorded request had) and its segments
at the end (`segments`, as `torch.cuda.memory._snapshot()` lays them out).

Why a loop of its own, not a flag of `replay`: the viewer needs each allocation's block address,
which only the Python model holds (the native core keeps none), and the hot replay loop must not
pay for a hook it rarely needs. The allocator itself is the same object replay drives (the model
the native core is held identical to), so the snapshot's segment events are those of `replay`
(`tests/test_sim_export.py` checks peaks and events against it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from alloctune.sim.driver import H200_TOTAL
from alloctune.sim.replay import _address_model, make_allocator
from alloctune.sim.session import fall_back
from alloctune.sim.settings import SimSettings
from alloctune.trace.model import ALLOC, EMPTY_CACHE, FAILED_ALLOC, FREE, Trace

# Snapshot key of what produced the file, so a reader can tell a simulated run from a recorded one.
SIMULATED_KEY = "alloctune_simulated"


def simulated_snapshot(
    trace: Trace,
    config: Any = None,
    *,
    budget: int | None = None,
    total_memory: int | None = None,
    torch: str | None = None,
    addresses: Any = "recorded",
) -> dict[str, Any]:
    """The replay of `trace` under `config` and `budget` as a `_dump_snapshot`-style dict.

    Stops at the first OOM, as the program would have (the `oom` entry is the last event).
    Times are the request indices (µs in the format; the simulator has no clock).
    """
    settings = SimSettings.from_config(config, torch)
    total = int(total_memory or trace.total_memory or H200_TOTAL)
    alloc = make_allocator(
        settings, budget=budget, total_memory=total, addresses=_address_model(trace, addresses, None), record_events=False
    )
    out: list[dict[str, Any]] = []
    frames_of = _frames_lookup(trace)

    def on_event(ev: Any) -> None:
        out.append(
            {
                "action": ev.action,
                "addr": ev.addr,
                "size": ev.size,
                "stream": ev.stream,
                "time_us": alloc.request_index,
                "frames": [],
            }
        )

    alloc.on_event = on_event
    req = trace.requests
    live: dict[int, tuple[Any, int]] = {}  # allocation id -> (block, request index that made it)
    for i, (op, size, rid, stream) in enumerate(req):
        alloc.request_index = i
        if op == ALLOC:  # the replay loop's rules: fallbacks for a failed allocation, none for a recorded failure
            b = alloc.malloc(size, stream)
            if b is None and i in req.fallbacks:
                b = fall_back(alloc.malloc, req.fallbacks[i], stream)
            if b is None:
                break  # the program would have died here (the allocator wrote the `oom` entry)
            out.append(
                {"action": "alloc", "addr": b.addr, "size": b.requested, "stream": stream, "time_us": i, "frames": frames_of(i)}
            )
            live[rid] = (b, i)
        elif op == FAILED_ALLOC:
            b = alloc.malloc(size, stream)
            if b is not None:  # it fits here, though the program never got it: give it straight back
                alloc.free(b)
        elif op == FREE:
            got = live.pop(rid, None)
            if got is None:
                continue
            b, made = got
            for action in ("free_requested", "free_completed"):
                out.append(
                    {
                        "action": action,
                        "addr": b.addr,
                        "size": b.requested,
                        "stream": b.seg.stream,
                        "time_us": i,
                        "frames": frames_of(made),
                    }
                )
            alloc.free(b)
        elif op == EMPTY_CACHE:
            alloc.empty_cache()
    if out and out[-1]["action"] == "oom" and alloc.oom is not None and alloc.oom.device_free is not None:
        out[-1]["device_free"] = int(alloc.oom.device_free)  # what the device model had left at the failure
    made_at = {b.addr: i for b, i in live.values()}
    segments = []
    for seg in alloc.segment_table():
        blocks = [
            dict(
                blk,
                frames=frames_of(made_at[blk["address"]])
                if blk["state"] == "active_allocated" and blk["address"] in made_at
                else [],
            )
            for blk in seg["blocks"]
        ]
        segments.append(dict(seg, device=0, active_size=seg["allocated_size"], segment_pool_id=[0, 0], frames=[], blocks=blocks))
    return {
        "segments": segments,
        "device_traces": [out],
        "allocator_settings": _torch_settings(settings, config),
        SIMULATED_KEY: {
            "source": trace.source,
            "config": _conf_text(config),
            "budget": budget,
            "total_memory": total,
            "requests_done": alloc.request_index + 1,
            "peak_reserved": alloc.stats.reserved_peak,
        },
    }


def write_snapshot(snapshot: dict[str, Any], path: str | Path) -> Path:
    """Write a snapshot dict the way `torch.cuda.memory._dump_snapshot` does (a pickle; `.gz`/`.xz`
    compressed by suffix). Only our own plain data is pickled here; reading one back goes through
    the restricted loader like any other file."""
    import gzip
    import lzma
    import pickle

    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else lzma.open if path.suffix == ".xz" else open
    tmp = path.with_name(path.name + ".tmp")
    with opener(tmp, "wb") as fh:
        pickle.dump(snapshot, fh, protocol=4)
    tmp.replace(path)
    return path


def _frames_lookup(trace: Trace) -> Any:
    """Request index -> the Python frames its recorded event carried ([] when the recording has none)."""
    events: Sequence[Any] = trace.events or ()
    index = trace.requests.event_index

    def frames(i: int) -> list[dict[str, Any]]:
        try:
            e = events[index[i]]
        except (IndexError, TypeError):
            return []
        f = e.get("frames") if isinstance(e, dict) else None
        return [dict(x) for x in f] if isinstance(f, list) else []

    return frames


def _conf_text(config: Any) -> str:
    if config is None:
        return ""
    fmt = getattr(config, "format", None)
    return fmt() if callable(fmt) else str(config)


def _torch_settings(settings: SimSettings, config: Any) -> dict[str, Any]:
    """`allocator_settings` as torch writes them (what the loader and the viewer read back; the
    knobs torch does not list there travel in the setting's text)."""
    mss = settings.max_split_size
    table = settings.roundup_power2_divisions
    return {
        "PYTORCH_CUDA_ALLOC_CONF": _conf_text(config),
        "max_split_size": -1 if mss is None else int(mss),
        "garbage_collection_threshold": float(settings.garbage_collection_threshold or 0.0),
        "expandable_segments": bool(settings.expandable_segments),
        "roundup_power2_divisions": {str(1 << i): int(v) for i, v in enumerate(table)},
    }


def export_simulated_run(
    trace_file: str | Path,
    conf: str,
    out: str | Path,
    *,
    budget: int | str | None = None,
    total_memory: int | str | None = None,
    device: int | None = None,
    torch: str = "2.11",
    addresses: str = "trace",
) -> dict[str, Any]:
    """`simulate --snapshot-out`: load, simulate one setting, write the snapshot; returns what was
    written (path, events, peak reserved, whether it ran out of memory) for the command to print."""
    from alloctune.config import AllocatorConfig
    from alloctune.trace import load_trace
    from alloctune.units import parse_user_size

    cap = parse_user_size(budget, "--budget") if budget is not None else None
    total = parse_user_size(total_memory, "--total-memory") if total_memory is not None else None
    trace = load_trace(trace_file, device)
    config = AllocatorConfig.parse(conf, torch)
    snap = simulated_snapshot(
        trace, config, budget=cap, total_memory=total, torch=torch, addresses="model" if addresses == "model" else "recorded"
    )
    path = write_snapshot(snap, out)
    events = snap["device_traces"][0]
    return {
        "path": str(path),
        "events": len(events),
        "peak_reserved": snap[SIMULATED_KEY]["peak_reserved"],
        "oom": bool(events) and events[-1]["action"] == "oom",
        "config": config.format(),
    }
