"""The plain data a report is built from, and readers that turn input files into it.

Three kinds of input become the same few records, so one set of figures and one HTML page
covers them all: a tune store (JSONL of trials), simulation results (`alloctune simulate
--json`), and recorded snapshots (replayed here to get their timeline and segment map).
Reading is tolerant about optional fields because these files are written by other commands
and versions; anything that is not one of the three is a one-line `InputError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from alloctune.diagnose.snapshot_model import SnapshotDiagnosis
from alloctune.errors import InputError, TraceError
from alloctune.memory_map.model import MemoryMap

SCHEMA = "alloctune.report/1"
MAX_POINTS = 1500  # per timeline series in figures and JSON: enough to see every peak
_SNAPSHOT_SUFFIXES = (".pickle", ".pkl", ".xz", ".gz", ".bz2")


@dataclass(frozen=True)
class Series:
    """Reserved / allocated bytes over the history of one run (downsampled, peaks kept)."""

    label: str
    x: tuple[int, ...]  # history event index (comparable across settings: same request stream)
    reserved: tuple[int, ...]
    allocated: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "x": list(self.x), "reserved": list(self.reserved), "allocated": list(self.allocated)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Series":
        return cls(str(d["label"]), tuple(d["x"]), tuple(d["reserved"]), tuple(d["allocated"]))


@dataclass(frozen=True)
class SettingRow:
    """One setting's result (a trial, a simulation, or a recorded run), in `memory_stats` terms."""

    label: str
    config: str
    kind: str  # "trial", "simulation" or "trace"
    outcome: str = ""
    budget: int | None = None
    peak_reserved: int | None = None
    peak_allocated: int | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None
    wall_s: float | None = None
    min_budget: int | None = None
    source: str = ""

    @property
    def utilization(self) -> float | None:
        """Peak allocated ÷ peak reserved (the project's `utilization`)."""
        if self.peak_reserved and self.peak_allocated is not None:
            return self.peak_allocated / self.peak_reserved
        return None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["utilization"] = self.utilization
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SettingRow":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class SegmentMapView:
    """A memory map to draw, with what it shows (peak or OOM) and the failed request if any."""

    label: str
    caption: str
    memory_map: MemoryMap
    request: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "caption": self.caption,
            "request": self.request,
            "memory_map": self.memory_map.to_dict(),
        }


@dataclass(frozen=True)
class ReportData:
    title: str
    inputs: tuple[str, ...]
    rows: tuple[SettingRow, ...] = ()
    series: tuple[Series, ...] = ()
    maps: tuple[SegmentMapView, ...] = ()
    diagnoses: tuple[SnapshotDiagnosis, ...] = ()
    notes: tuple[str, ...] = ()
    explains: tuple[Any, ...] = ()  # report.explain_view.ExplainView per recording explained

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "title": self.title,
            "inputs": list(self.inputs),
            "rows": [r.to_dict() for r in self.rows],
            "series": [s.to_dict() for s in self.series],
            "maps": [m.to_dict() for m in self.maps],
            "diagnoses": [d.to_dict(with_map=False) for d in self.diagnoses],
            "notes": list(self.notes),
            "explains": [v.to_dict() for v in self.explains],
        }


def downsample(x: Sequence[int], *cols: Sequence[int], max_points: int = MAX_POINTS) -> tuple[tuple[int, ...], ...]:
    """Keep at most `max_points` points, taking each bucket's maximum so no peak is lost."""
    n = len(x)
    if n <= max_points:
        return (tuple(x),) + tuple(tuple(c) for c in cols)
    step = -(-n // max_points)
    xs: list[int] = []
    outs: list[list[int]] = [[] for _ in cols]
    for start in range(0, n, step):
        stop = min(start + step, n)
        xs.append(x[stop - 1])
        for out, col in zip(outs, cols):
            out.append(max(col[start:stop]))
    return (tuple(xs),) + tuple(tuple(o) for o in outs)


# --------------------------------------------------------------------------------------------
# Readers.


def _first(d: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        if name in d and d[name] is not None:
            return d[name]
    stats = d.get("stats")
    if isinstance(stats, Mapping):
        for name in names:
            if name in stats and stats[name] is not None:
                return stats[name]
    return None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _config_of(d: Mapping[str, Any]) -> str:
    value = _first(d, "config", "conf", "alloc_conf", "allocator_config")
    if isinstance(value, Mapping):  # a config object's to_dict()
        value = value.get("text", value.get("string", json.dumps(value, sort_keys=True)))
    return "" if value is None else str(value)


def _config_from_settings(settings: Any) -> str:
    """A readable setting string from a simulator `settings` dict (its non-default knobs)."""
    if not isinstance(settings, Mapping):
        return ""
    parts = []
    if settings.get("expandable_segments"):
        parts.append("expandable_segments:True")
    mss = settings.get("max_split_size")
    if isinstance(mss, int) and mss > 0:
        parts.append(f"max_split_size_mb:{mss // (1 << 20)}")
    gc = settings.get("garbage_collection_threshold")
    if gc:
        parts.append(f"garbage_collection_threshold:{gc}")
    div = settings.get("roundup_power2_divisions")
    if isinstance(div, (list, tuple)) and any(div):
        parts.append("roundup_power2_divisions:[" + ",".join(str(int(v)) for v in div) + "]")
    return ",".join(parts)


def _label(config: str) -> str:
    from alloctune.config.standard import setting_label

    return setting_label(config)


def row_from_record(d: Mapping[str, Any], kind: str, source: str) -> SettingRow:
    """One trial / simulation record as a row; field names follow `memory_stats` and DESIGN.md."""
    config = _config_of(d)
    if not config and kind == "simulation":
        config = _config_from_settings(d.get("settings"))
    outcome = _first(d, "outcome", "status")
    if outcome is None and kind == "simulation":
        if isinstance(d.get("completed"), bool):
            outcome = "ok" if d["completed"] else "oom"
        else:
            outcome = "oom" if _first(d, "oom") not in (None, False) else "ok"
    label = str(d.get("label") or _label(config))
    if kind == "simulation":
        label += " (sim)"  # kept apart from measured trials of the same setting
    return SettingRow(
        label=label,
        config=config,
        kind=kind,
        outcome=str(outcome or ""),
        budget=_int(_first(d, "budget", "cap")),
        peak_reserved=_int(_first(d, "peak_reserved", "reserved_bytes.all.peak")),
        peak_allocated=_int(_first(d, "peak_allocated", "allocated_bytes.all.peak")),
        num_alloc_retries=_int(_first(d, "num_alloc_retries")),
        num_ooms=_int(_first(d, "num_ooms")),
        wall_s=_first(d, "wall_s", "wall_time_s"),
        min_budget=_int(_first(d, "min_budget")),
        source=source,
    )


def read_tune_store(path: str | Path) -> list[SettingRow]:
    """Trial rows of a tune store (JSONL), plus one `min_budget` row per setting where known.

    `min_budget` is taken from records that carry it (the bisection's result); otherwise it is
    the smallest budget under which a trial of that setting finished `ok`, which is only an
    upper bound and is labelled so by the caller's notes.
    """
    rows: list[SettingRow] = []
    text = Path(path).read_text()
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            raise InputError(f"{path}:{lineno}: not a JSON line; expected a tune store written by alloctune tune") from None
        if not isinstance(rec, Mapping) or rec.get("kind") == "header" or rec.get("type") == "header":
            continue
        if isinstance(rec.get("result"), Mapping):  # `alloctune tune`'s store: {"kind": "trial", "key", "result"}
            rec = rec["result"]
        if not any(k in rec for k in ("conf", "config", "min_budget")):
            continue
        rows.append(row_from_record(rec, "trial", str(path)))
    if not rows:
        raise InputError(f"{path}: no trial records found; expected the JSONL store of alloctune tune")
    return rows


def min_budgets(rows: Iterable[SettingRow]) -> dict[str, tuple[int, str]]:
    """Per setting label: (min_budget, how it was obtained).

    Only tune trials count as evidence of "completes under this cap"; a recorded trace is one
    run under its own label, not a search.
    """
    out: dict[str, tuple[int, str]] = {}
    for r in rows:
        if r.min_budget is not None:
            out[r.label] = (r.min_budget, "bisection")  # measured, or simulated for "(sim)" labels
    for r in rows:
        if r.label in out and out[r.label][1] == "bisection":
            continue
        if r.kind == "trial" and r.outcome == "ok" and r.budget:
            prev = out.get(r.label)
            if prev is None or r.budget < prev[0]:
                out[r.label] = (r.budget, "smallest ok trial")
    return out


def read_simulation(path: str | Path, data: Any) -> tuple[list[SettingRow], list[Series]]:
    """Rows and timelines from `alloctune simulate --json` (one result or a list / sweep of them)."""
    if isinstance(data, Mapping):
        results = data.get("rows") or data.get("results") or data.get("runs") or [data]
    elif isinstance(data, list):
        results = data
    else:
        raise InputError(f"{path}: expected a JSON object or list from alloctune simulate --json")
    rows, series = [], []
    for res in results:
        if not isinstance(res, Mapping):
            continue
        row = row_from_record(res, "simulation", str(path))
        rows.append(row)
        tl = res.get("timeline")
        if isinstance(tl, Mapping) and tl.get("reserved"):
            x = tl.get("index") or tl.get("request_index") or tl.get("x") or list(range(len(tl["reserved"])))
            xs, rs, al = downsample(x, tl["reserved"], tl.get("allocated") or [0] * len(tl["reserved"]))
            series.append(Series(row.label, xs, rs, al))
    if not rows:
        raise InputError(f"{path}: no simulation results found")
    return rows, series


@dataclass
class TraceInput:
    """What one snapshot contributes: its row, timeline, segment map and (if it OOMed) a diagnosis."""

    row: SettingRow
    series: Series
    map_view: SegmentMapView
    diagnosis: SnapshotDiagnosis | None = None
    notes: list[str] = field(default_factory=list)
    has_stacks: bool = False  # the recording kept Python frames (explain can name code lines)


def read_trace(path: str | Path, device: int | None = None, what_if: bool = False) -> TraceInput:
    """Replay a snapshot's history: timeline, peak, segment map at the OOM (or at the peak)."""
    from alloctune.config.standard import STANDARD_CONFS
    from alloctune.diagnose.snapshot import diagnose_snapshot
    from alloctune.memory_map.build import HistoryGap, map_from_snapshot_segments, replay_history
    from alloctune.trace.load import load_snapshot, pick_device, read_sidecar

    snap = load_snapshot(path)
    dev = pick_device(snap, device, str(path))
    events = snap["device_traces"][dev]
    settings = snap.get("allocator_settings") or {}
    meta = read_sidecar(path)
    config = str(settings.get("PYTORCH_CUDA_ALLOC_CONF", meta.get("conf", "")) or "")
    name = Path(path).name.split(".")[0]
    label = f"{Path(path).parent.name}/{name}" if meta else name
    oom_indices = [i for i, e in enumerate(events) if e.get("action") == "oom"]
    notes: list[str] = []
    try:
        rp = replay_history(events, settings, capture=oom_indices[-1:], capture_peak=not oom_indices)
    except HistoryGap as exc:
        raise TraceError(
            f"{path}: the history does not start at an empty allocator ({exc}); record from the start of the "
            "run with a larger max_entries"
        ) from None
    if oom_indices:
        mm = rp.maps[oom_indices[-1]]
        caption = f"at the last OOM (history event {oom_indices[-1]}, {len(oom_indices)} OOM(s) recorded)"
        request = int(events[oom_indices[-1]].get("size", 0))
    else:
        mm = rp.maps.get(rp.peak_reserved_index) or map_from_snapshot_segments(snap.get("segments") or [], dev)
        caption = f"at the peak of reserved memory (history event {rp.peak_reserved_index})"
        request = None
    stats = meta.get("stats") if isinstance(meta.get("stats"), Mapping) else {}
    row = SettingRow(
        label=label,
        config=config,
        kind="trace",
        outcome=str(meta.get("outcome") or ("oom" if oom_indices else "ok")),
        budget=_int(meta.get("cap")) or None,
        peak_reserved=rp.peak_reserved,
        peak_allocated=max(rp.timeline.allocated, default=0),
        num_alloc_retries=_int(stats.get("num_alloc_retries")),
        num_ooms=_int(stats.get("num_ooms")) if stats else len(oom_indices),
        wall_s=meta.get("wall_s"),
        source=str(path),
    )
    tl = rp.timeline
    xs, rs, al = downsample(tl.event_index, tl.reserved, tl.allocated)
    diagnosis = None
    if oom_indices:
        diagnosis = diagnose_snapshot(snap, source=str(path), device=dev, candidates=STANDARD_CONFS if what_if else None)
    has_stacks = any(e.get("frames") for e in events if isinstance(e, Mapping))
    return TraceInput(row, Series(label, xs, rs, al), SegmentMapView(label, caption, mm, request), diagnosis, notes, has_stacks)


def classify(path: str | Path) -> str:
    """'tune', 'simulation' or 'trace' by content (suffix only as a first hint)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if p.is_dir():
        return "dir"
    name = p.name.lower()
    if name.endswith(".jsonl"):
        return "tune"
    if name.endswith(_SNAPSHOT_SUFFIXES):
        return "trace"
    if name.endswith(".json"):
        return "simulation"
    with open(p, "rb") as fh:
        head = fh.read(64).lstrip()
    if head[:1] == b"{" and b"\n{" in Path(p).read_bytes()[:1_000_000]:
        return "tune"
    if head[:1] in (b"{", b"["):
        return "simulation"
    return "trace"


def expand_inputs(paths: Sequence[str | Path]) -> list[Path]:
    """Files to read: directories expand to the snapshots and stores inside them (sorted); a name
    that is no file but a shipped trace's (`rvc_h200`) is that trace, as for every recording."""
    from alloctune.trace.shipped import resolve_recording

    out: list[Path] = []
    for raw in paths:
        p = resolve_recording(raw)
        if p.is_dir():
            found = sorted(
                f for f in p.iterdir() if f.is_file() and (f.name.endswith(_SNAPSHOT_SUFFIXES) or f.suffix == ".jsonl")
            )
            if not found:
                raise InputError(f"{p}: directory holds no snapshots (*.pickle[.xz|.gz]) or tune stores (*.jsonl)")
            out.extend(found)
        elif not p.exists():
            raise InputError(f"{p}: no such file")
        else:
            out.append(p)
    return out


def build_report(
    paths: Sequence[str | Path],
    *,
    title: str = "alloctune report",
    device: int | None = None,
    what_if: bool = False,
    explain: bool | None = None,
) -> ReportData:
    """Read every input and gather the rows, timelines, segment maps and OOM diagnoses.

    `explain`: add `alloctune explain`'s section for each recording (None: for recordings made
    with Python stacks, where it can name the code that holds the memory)."""
    files = expand_inputs(paths)
    if not files:
        raise InputError("no inputs given: pass tune stores (*.jsonl), simulate --json results or snapshots")
    rows: list[SettingRow] = []
    series: list[Series] = []
    maps: list[SegmentMapView] = []
    diagnoses: list[SnapshotDiagnosis] = []
    notes: list[str] = []
    explains: list[Any] = []
    for f in files:
        kind = classify(f)
        if kind == "tune":
            rows.extend(read_tune_store(f))
        elif kind == "simulation":
            try:
                data = json.loads(f.read_text())
            except ValueError as exc:
                raise InputError(f"{f}: not valid JSON ({exc}); expected the output of alloctune simulate --json") from None
            r, s = read_simulation(f, data)
            rows.extend(r)
            series.extend(s)
        else:
            ti = read_trace(f, device=device, what_if=what_if)
            rows.append(ti.row)
            series.append(ti.series)
            maps.append(ti.map_view)
            if ti.diagnosis is not None:
                diagnoses.append(ti.diagnosis)
            notes.extend(ti.notes)
            if explain or (explain is None and ti.has_stacks):
                from alloctune.report.explain_view import explain_recording

                explains.append(explain_recording(f, device=device))
    budgets = min_budgets(rows)
    if any(how != "bisection" for _, how in budgets.values()):
        notes.append("min_budget marked 'smallest ok trial' is an upper bound: the store holds no bisection result")
    return ReportData(
        title,
        tuple(str(f) for f in files),
        tuple(rows),
        tuple(series),
        tuple(maps),
        tuple(diagnoses),
        tuple(notes),
        tuple(explains),
    )
