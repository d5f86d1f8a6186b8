"""The ranks of a multi-process workload (`torchrun --nproc-per-node N`) side by side.

The agent loads in every process that Python starts with our `PYTHONPATH` (the launcher and
each rank) and each writes its own report, carrying `RANK`/`LOCAL_RANK`. A trial's outcome
is the worst rank's and its peaks the busiest rank's (`runner`); this module keeps one short
row per rank, so the question people ask of multi-GPU jobs — why does rank 0 use 3 GiB more
than the others? — is answered by the trial itself. Pure data; rich only in `rank_table`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping, Sequence

from alloctune.run.reports import memory_fields

RANK_SCHEMA = 1
# How bad an outcome is, worst first: the trial of a job is as bad as its worst rank.
SEVERITY = ("budget-too-large", "oom", "crash", "timeout", "no-cuda", "ok")


@dataclass(frozen=True)
class RankSummary:
    """One rank's evidence, as its agent reported it."""

    rank: int
    local_rank: int | None
    pid: int | None
    device: int | None
    outcome: str
    peak_reserved: int | None = None
    peak_allocated: int | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None
    snapshot: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["schema"] = RANK_SCHEMA
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RankSummary":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def summarize_ranks(reports: Iterable[Mapping[str, Any]]) -> tuple[RankSummary, ...]:
    """One summary per rank report, by rank; () for a single-process workload (no RANK set).

    The launcher (torchrun itself) also loads the agent but has no rank: it is left out.
    """
    out = []
    for r in reports:
        if r.get("rank") is None:
            continue
        stats = r.get("stats") or {}
        exc = r.get("exception") or {}
        out.append(
            RankSummary(
                rank=int(r["rank"]),
                local_rank=r.get("local_rank"),
                pid=r.get("pid"),
                device=r.get("device"),
                outcome=str(r.get("outcome") or "crash"),
                **memory_fields(stats),
                snapshot=r.get("snapshot"),
                error=f"{exc.get('type')}: {str(exc.get('message') or '').splitlines()[0] if exc.get('message') else ''}"
                if exc
                else None,
            )
        )
    return tuple(sorted(out, key=lambda s: (s.rank, s.pid or 0)))


def worst(outcomes: Iterable[str]) -> str | None:
    """The worst of several outcomes (unknown ones count as a crash)."""
    ranked = [SEVERITY.index(o) if o in SEVERITY else SEVERITY.index("crash") for o in outcomes]
    return SEVERITY[min(ranked)] if ranked else None


def neediest(ranks: Sequence[RankSummary]) -> RankSummary | None:
    """The rank that needs most memory (what a budget must fit): highest peak reserved."""
    return max(ranks, key=lambda s: s.peak_reserved or 0, default=None)


def processes_per_gpu(ranks: Sequence[RankSummary | Mapping[str, Any]]) -> int:
    """Most ranks that shared one device in a run (1 for a single process): what a packed trial books.

    From the baseline's ranks, so a sweep over `torchrun --nproc-per-node 2` on one GPU books two
    caps and two contexts per trial without being told.
    """
    counts: dict[Any, int] = {}
    for r in ranks:
        device = r.device if isinstance(r, RankSummary) else r.get("device")
        counts[device] = counts.get(device, 0) + 1
    return max(counts.values(), default=1)


def rank_table(ranks: Sequence[RankSummary | Mapping[str, Any]], title: str = "ranks") -> Any:
    """A rich table, one column per rank, so uneven memory across ranks shows at a glance."""
    from rich.table import Table

    from alloctune.units import format_size

    rows = [r if isinstance(r, RankSummary) else RankSummary.from_dict(r) for r in ranks]
    top = neediest(rows)
    t = Table(title=title, title_justify="left")
    t.add_column("")
    for r in rows:
        mark = " *" if top is not None and r is top and len(rows) > 1 else ""
        t.add_column(f"rank {r.rank}{mark}", justify="right")

    def size(n: int | None) -> str:
        return "-" if n is None else format_size(n)

    t.add_row(
        "local rank / device",
        *[f"{'-' if r.local_rank is None else r.local_rank} / {'-' if r.device is None else f'cuda:{r.device}'}" for r in rows],
    )
    t.add_row("outcome", *[r.outcome for r in rows])
    t.add_row("peak reserved", *[size(r.peak_reserved) for r in rows])
    t.add_row("peak allocated", *[size(r.peak_allocated) for r in rows])
    t.add_row(
        "alloc retries / OOMs",
        *[
            f"{'-' if r.num_alloc_retries is None else r.num_alloc_retries} / {'-' if r.num_ooms is None else r.num_ooms}"
            for r in rows
        ],
    )
    if any(r.snapshot for r in rows):
        t.add_row("recording", *[r.snapshot or "-" for r in rows])
    if any(r.error for r in rows):
        t.add_row("error", *[r.error or "" for r in rows])
    return t
