"""The explain section of a report page, and the standalone page `explain --html` writes.

Inline SVG drawn with the report's own helpers (`report/svg.py`), no script: hovering shows
the numbers through SVG `<title>` tooltips, and clicking a site (its row, its legend entry or
any of its blocks in the map) makes that site's row the page's `:target`, which the page's CSS
turns into a highlight of the site's blocks and line (`:has()`, one rule per site). So the page
opens from an e-mail attachment or an air-gapped machine and runs nothing. Every number shown
is the explanation's (`format_size`, as `alloctune explain` prints it).
"""

from __future__ import annotations

import html
from datetime import datetime, timezone
from typing import Mapping, Sequence

from alloctune.explain.model import CATEGORIES
from alloctune.memory_map.model import SegmentView
from alloctune.report.explain_view import OTHER, ExplainView
from alloctune.report.style import axis_unit
from alloctune.report.svg import _rect, _svg, _text
from alloctune.units import format_size

CATEGORY_COLORS = {
    "model_state": "#2c5282",
    "gradients": "#3182ce",
    "optimizer_state": "#805ad5",
    "activations": "#38a169",
    "growing": "#e53e3e",
    "rounding": "#a0aec0",
    "inactive_split": "#ed8936",
    "cached_free": "#f6e05e",
}
STACK_ORDER = (
    "model_state",
    "gradients",
    "optimizer_state",
    "growing",
    "activations",
    "rounding",
    "inactive_split",
    "cached_free",
)
PHASE_COLORS = {
    "forward": "#3182ce",
    "backward": "#dd6b20",
    "optimizer_step": "#805ad5",
    "zero_grad": "#d53f8c",
    "other": "#718096",
    "rounding": "#a0aec0",
}
SITE_COLORS = ("#e53e3e", "#3182ce", "#38a169", "#805ad5", "#dd6b20", "#319795", "#d53f8c", "#718096")
MAP_ROWS = 36  # the map wraps reserved memory into this many rows of equal bytes
MAX_MAP_BLOCKS = 20_000  # live blocks above which sub-pixel neighbours of different sites share a rect
X0, X1 = 70, 880  # plot area of the charts (the SVG is 900 wide)

EXPLAIN_CSS = """
figure.xp svg { width: 100%; height: auto; }
.xp-tbl tr.site:target { background: #fefcbf; }
.xp-tbl a { color: inherit; }
.xp-tbl code { white-space: pre-wrap; overflow-wrap: anywhere; }
svg .col { fill: transparent; }
svg .col:hover { fill: rgba(0,0,0,.06); }
svg .blk { stroke: none; }
svg a .blk:hover { stroke: #1a202c; stroke-width: 1px; }
body:has(tr.site:target) svg .blk { opacity: .25; }
body:has(tr.site:target) svg .sl { opacity: .25; }
.xp-legend span { display: inline-block; margin-right: 1rem; font-size: .8rem; }
.xp-legend i { display: inline-block; width: .8rem; height: .8rem; margin-right: .3rem; vertical-align: -1px; }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _fmt(n: int | None) -> str:
    """As `alloctune explain` prints a size (negative with a sign; None as '-')."""
    return "-" if n is None else format_size(n) if n >= 0 else "-" + format_size(-n)


def site_anchor(row: int, prefix: str = "") -> str:
    """The id of a site's table row, also the `data-site` of its blocks and line (`prefix`: one per
    explain section of a page, so that two sections never share an id)."""
    return f"{prefix}site-other" if row == OTHER else f"{prefix}site-{row}"


def highlight_css(view: ExplainView, prefix: str = "") -> str:
    """One rule per site: its row targeted -> its blocks and its line stand out."""
    rules = []
    for row in list(range(len(view.explanation.sites))) + [OTHER]:
        a = site_anchor(row, prefix)
        rules.append(f'body:has(#{a}:target) svg .blk[data-site="{a}"] {{ opacity: 1; stroke: #1a202c; stroke-width: 1.5px; }}')
        rules.append(f'body:has(#{a}:target) svg .sl[data-site="{a}"] {{ opacity: 1; stroke-width: 3px; }}')
    return "\n".join(rules)


def _ticks(top: float) -> list[float]:
    """Round tick values from 0 to at least `top` (1, 2 or 5 times a power of ten)."""
    if top <= 0:
        return [0.0, 1.0]
    import math

    raw = top / 8
    p = 10 ** math.floor(math.log10(raw))
    step = next(m * p for m in (1, 2, 5, 10) if m * p >= raw)
    n = int(math.ceil(top / step - 1e-9))
    return [i * step for i in range(n + 1)]


def _num(v: float) -> str:
    return f"{v:.0f}" if abs(v - round(v)) < 1e-9 else f"{v:g}"


class _Axes:
    """Shared x (recording event) and y (bytes) scales of the two over-time charts."""

    def __init__(self, view: ExplainView, top_bytes: int, y0: float, height: float) -> None:
        ot = view.over_time
        self.xs = list(ot.event)
        self.x_label = "recording event index (explain --at N)"
        self.lo, self.hi = self.xs[0], max(self.xs[-1], self.xs[0] + 1e-9)
        self.scale, self.unit = axis_unit(max(top_bytes, 1))
        self.yticks = _ticks(top_bytes / self.scale)
        self.ymax = self.yticks[-1] * self.scale or 1
        self.y0, self.h = y0, height

    def x(self, v: float) -> float:
        return X0 + (v - self.lo) / (self.hi - self.lo) * (X1 - X0)

    def y(self, b: float) -> float:
        return self.y0 + self.h - b / self.ymax * self.h

    def frame(self, y_title: str) -> list[str]:
        out = [_rect(X0, self.y0, X1 - X0, self.h, "none", ' stroke="#a0aec0"')]
        for t in self.yticks:
            yy = self.y(t * self.scale)
            out.append(f'<line x1="{X0}" x2="{X1}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#edf2f7"/>')
            out.append(_text(X0 - 4, yy + 3, f"{_num(t)}", anchor="end", size=9))
        out.append(
            f'<text x="14" y="{self.y0 + self.h / 2:.1f}" font-size="10" text-anchor="middle" '
            f'transform="rotate(-90 14 {self.y0 + self.h / 2:.1f})">{_e(y_title)} ({self.unit})</text>'
        )
        ticks = _ticks(self.hi - self.lo) if self.hi > self.lo else []
        step = ticks[1] if len(ticks) > 1 else 0
        first = -(-self.lo // step) * step if step else self.lo
        for t in ticks:
            v = first + t
            if v > self.hi + 1e-9:
                break
            xx = self.x(v)
            out.append(
                f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{self.y0 + self.h}" y2="{self.y0 + self.h + 3}" stroke="#4a5568"/>'
            )
            out.append(_text(xx, self.y0 + self.h + 13, _num(round(v, 6)), anchor="middle", size=9))
        out.append(_text((X0 + X1) / 2, self.y0 + self.h + 26, self.x_label, anchor="middle", size=10))
        return out

    def columns(self, titles: Sequence[str]) -> list[str]:
        """Hover targets: one transparent column per sample point, its numbers in a tooltip."""
        out = []
        px = [self.x(v) for v in self.xs]
        for i, t in enumerate(titles):
            left = (px[i - 1] + px[i]) / 2 if i else px[i]
            right = (px[i] + px[i + 1]) / 2 if i + 1 < len(px) else px[i]
            out.append(
                f'<rect class="col" x="{left:.1f}" y="{self.y0}" width="{max(right - left, 1):.2f}" '
                f'height="{self.h}"><title>{_e(t)}</title></rect>'
            )
        return out


def _where(view: ExplainView, i: int) -> str:
    ot = view.over_time
    return f"event {ot.event[i]} (after request {ot.request[i]})"


def _stacked(
    ax: _Axes, px: Sequence[float], columns: Sequence[tuple[str, Sequence[int]]], colors: dict[str, str], kind: str
) -> list[str]:
    """One filled band per column, stacked in the given order (`kind`: the polygons' class and data key)."""
    out = []
    base = [0] * len(px)
    for name, col in columns:
        upper = [b + v for b, v in zip(base, col)]
        if any(col):
            pts = [f"{x:.1f},{ax.y(u):.1f}" for x, u in zip(px, upper)]
            pts += [f"{x:.1f},{ax.y(b):.1f}" for x, b in zip(reversed(px), reversed(base))]
            out.append(
                f'<polygon class="{kind}" data-{kind}="{name}" points="{" ".join(pts)}" '
                f'fill="{colors.get(name, "#718096")}" fill-opacity="0.85"><title>{_e(name)}</title></polygon>'
            )
        base = upper
    return out


def categories_svg(view: ExplainView) -> bytes:
    """Reserved memory over the run stacked by category (allocated = the categories below
    `inactive_split`), the explained moment marked."""
    ot = view.over_time
    ex = view.explanation
    top = max(ot.reserved)
    ax = _Axes(view, top, 30, 250)
    body = [
        _text(
            X0,
            16,
            f"Reserved memory over the run by category: {_fmt(ex.reserved)} at the {ex.moment_name} (event {ex.moment['event']})",
            weight="bold",
            size=12,
        )
    ]
    body += ax.frame("bytes")
    px = [ax.x(v) for v in ax.xs]
    body += _stacked(ax, px, [(c, ot.categories[c]) for c in STACK_ORDER], CATEGORY_COLORS, "cat")
    alloc_pts = " ".join(f"{x:.1f},{ax.y(a):.1f}" for x, a in zip(px, ot.allocated))
    body.append(f'<polyline points="{alloc_pts}" fill="none" stroke="#1a202c" stroke-width="1" stroke-dasharray="3,2"/>')
    mx = px[ot.moment]
    body.append(f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{ax.y0 - 4}" y2="{ax.y0 + ax.h}" stroke="#1a202c" stroke-width="1.2"/>')
    anchor = "end" if mx > (X0 + X1) / 2 else "start"
    body.append(
        _text(
            mx + (-4 if anchor == "end" else 4),
            ax.y0 + 8,
            f"{ex.moment_name}: {_fmt(ex.reserved)} reserved, {_fmt(ex.moment['allocated'])} allocated",
            anchor=anchor,
            size=10,
            weight="bold",
        )
    )
    titles = []
    for i in range(len(ot.request)):
        lines = [_where(view, i), f"reserved {_fmt(ot.reserved[i])}, allocated {_fmt(ot.allocated[i])}"]
        lines += [f"{c}: {_fmt(ot.categories[c][i])}" for c in CATEGORIES if ot.categories[c][i]]
        titles.append("\n".join(lines))
    body += ax.columns(titles)
    return _svg(ax.y0 + ax.h + 34, body, "Reserved memory over the run by category")


def phases_svg(view: ExplainView) -> bytes:
    """Allocated memory over the run stacked by the phase of the step that made it, the moment marked."""
    ot = view.over_time
    ex = view.explanation
    ax = _Axes(view, max(ot.allocated), 30, 200)
    where = f" ({ex.moment['phase'].replace('_', ' ')})" if "phase" in ex.moment else ""
    body = [
        _text(
            X0,
            16,
            f"Allocated memory over the run by the phase that made it: {_fmt(ex.moment['allocated'])} "
            f"at the {ex.moment_name}{where}",
            weight="bold",
            size=12,
        )
    ]
    body += ax.frame("bytes")
    px = [ax.x(v) for v in ax.xs]
    body += _stacked(ax, px, list(ot.phases.items()), PHASE_COLORS, "phase")
    mx = px[ot.moment]
    body.append(f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{ax.y0 - 4}" y2="{ax.y0 + ax.h}" stroke="#1a202c" stroke-width="1.2"/>')
    titles = [
        "\n".join(
            [_where(view, i), f"allocated {_fmt(ot.allocated[i])}"]
            + [f"{p}: {_fmt(col[i])}" for p, col in ot.phases.items() if col[i]]
        )
        for i in range(len(ot.request))
    ]
    body += ax.columns(titles)
    return _svg(ax.y0 + ax.h + 34, body, "Allocated memory over the run by phase")


def _phase_legend(view: ExplainView) -> str:
    return (
        '<p class="xp-legend">'
        + "".join(
            f'<span><i style="background:{PHASE_COLORS.get(p, "#718096")}"></i>{_e(p)}</span>' for p in view.over_time.phases
        )
        + "</p>"
    )


def sites_svg(view: ExplainView, prefix: str = "") -> bytes:
    """Live requested bytes of the top sites over the run."""
    ot = view.over_time
    ex = view.explanation
    top = max((max(v) for _, v in ot.sites), default=0)
    ax = _Axes(view, top, 30, 200)
    body = [
        _text(X0, 16, "Live bytes of the top sites over the run (click a line or a site to highlight it)", weight="bold", size=12)
    ]
    body += ax.frame("live bytes")
    px = [ax.x(v) for v in ax.xs]
    for j, (row, col) in enumerate(ot.sites):
        pts = " ".join(f"{x:.1f},{ax.y(v):.1f}" for x, v in zip(px, col))
        color = SITE_COLORS[j % len(SITE_COLORS)]
        a = site_anchor(row, prefix)
        body.append(
            f'<a href="#{a}"><polyline class="sl" data-site="{a}" points="{pts}" fill="none" '
            f'stroke="{color}" stroke-width="1.6"><title>{_e(ex.sites[row].site)}</title></polyline></a>'
        )
    mx = px[ot.moment]
    body.append(f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{ax.y0}" y2="{ax.y0 + ax.h}" stroke="#1a202c" stroke-dasharray="2,2"/>')
    titles = []
    for i in range(len(ot.request)):
        lines = [_where(view, i)] + [f"{_fmt(col[i])}  {ex.sites[row].site}" for row, col in ot.sites]
        titles.append("\n".join(lines))
    body += ax.columns(titles)
    return _svg(ax.y0 + ax.h + 34, body, "Live bytes of the top sites over the run")


def segment_map_svg(view: ExplainView, prefix: str = "") -> bytes:
    """The memory map at the moment: every segment laid end to end (largest first), wrapped into
    rows of equal bytes; live blocks coloured by category, free bytes by overhead kind."""
    ex = view.explanation
    mm = view.memory_map
    segs = sorted(mm.segments, key=lambda s: (-s.size, s.addr))
    total = sum(s.size for s in segs) or 1
    row_bytes = -(-total // MAP_ROWS)
    x0, x1, rh, y0 = 20, 880, 14, 30
    per_px = row_bytes / (x1 - x0)
    scale, unit = axis_unit(row_bytes)
    where = f"{ex.moment_name} (event {ex.moment['event']})"
    body = [
        _text(
            x0,
            16,
            f"Memory map at the {where}: {len(segs)} segments, "
            f"{_fmt(mm.reserved)} reserved; each row {row_bytes / scale:.2f} {unit}",
            weight="bold",
            size=12,
        )
    ]
    names = {i: s.site for i, s in enumerate(ex.sites)}

    def place(off: int, size: int) -> list[tuple[float, float, float]]:
        """(x, y, width) pieces of the byte range [off, off + size) wrapped into rows."""
        out = []
        while size > 0:
            r, o = divmod(off, row_bytes)
            take = min(size, row_bytes - o)
            out.append((x0 + o / per_px, y0 + r * rh, take / per_px))
            off += take
            size -= take
        return out

    crowded = sum(1 for s in segs for b in s.blocks if b.allocated) > MAX_MAP_BLOCKS
    off = 0
    for seg in segs:
        has_live = any(b.allocated for b in seg.blocks)
        for start, size, requested, count, owner, _, owners in _block_runs(seg, off, view.owners, per_px, crowded):
            if owner is not None:
                row, cat = owner
                key = site_anchor(row, prefix)
                site = names.get(row, "a site not in the list")
                if len(owners) > 1:
                    site = f"{len(owners)} sites, most bytes: {site}"
                what = (
                    f"{_fmt(requested)} requested, {_fmt(size)} block"
                    if count == 1
                    else f"{count} blocks: {_fmt(requested)} requested, {_fmt(size)} in blocks"
                )
                tip = f"{site}\n{cat}: {what}\nsegment {seg.addr:#x}"
                for x, y, w in place(start, size):
                    body.append(
                        f'<a href="#{key}"><rect class="blk" data-site="{key}" data-cat="{cat}" '
                        f'x="{x:.2f}" y="{y}" width="{max(w, 0.4):.2f}" height="{rh - 2}" '
                        f'fill="{CATEGORY_COLORS.get(cat, "#718096")}"><title>{_e(tip)}</title></rect></a>'
                    )
            else:
                kind = "inactive_split" if has_live else "cached_free"
                tip = f"free ({kind}): {_fmt(size)}\nsegment {seg.addr:#x}"
                for x, y, w in place(start, size):
                    body.append(
                        f'<rect class="free" x="{x:.2f}" y="{y}" width="{w:.2f}" height="{rh - 2}" '
                        f'fill="{CATEGORY_COLORS[kind]}"><title>{_e(tip)}</title></rect>'
                    )
        for x, y, _ in place(off, 1):  # segment starts
            body.append(f'<line x1="{x:.2f}" x2="{x:.2f}" y1="{y - 1}" y2="{y + rh - 1}" stroke="#1a202c" stroke-width="1"/>')
        off += seg.size
    rows = -(-total // row_bytes)
    h = y0 + rows * rh + 24
    body.append(
        _text(
            x0,
            h - 8,
            f"offset in the row, 0 – {row_bytes / scale:.2f} {unit}; black ticks: segment "
            "starts; colours as the categories; click a block to highlight its site",
            size=10,
        )
    )
    return _svg(h, body, "Memory map at the moment")


def _block_runs(seg: SegmentView, off: int, owners: Mapping[int, tuple[int, str]], per_px: float, crowded: bool) -> list[list]:
    """The rects of one segment (at byte `off` of the map): each block, or a run of tiny blocks drawn as one.

    Runs of neighbouring live blocks of one site and category, each under 2 px, become one
    rect (a map of thousands of tiny blocks stays a small page); larger blocks stay single.
    A crowded map (more than MAX_MAP_BLOCKS live blocks) also merges tiny blocks of other
    sites into a run narrower than a pixel, drawn as its largest owner's."""
    runs: list[list] = []  # [start, bytes, requested, blocks, owner or None, tiny, bytes per owner]
    for b in seg.blocks:
        owner = owners.get(b.addr, (OTHER, "activations")) if b.allocated else None
        tiny = b.size < 2 * per_px
        last = runs[-1] if runs else None
        if (
            owner is not None
            and tiny
            and last is not None
            and last[4] is not None
            and last[5]
            and last[0] + last[1] == off + (b.addr - seg.addr)
            and (last[4] == owner or crowded and last[1] < per_px)
        ):
            last[1] += b.size
            last[2] += b.requested
            last[3] += 1
            last[6][owner] = last[6].get(owner, 0) + b.size
            last[4] = max(last[6], key=last[6].get)
        else:
            runs.append([off + (b.addr - seg.addr), b.size, b.requested, 1, owner, tiny, {owner: b.size}])
    return runs


def _legend() -> str:
    return (
        '<p class="xp-legend">'
        + "".join(f'<span><i style="background:{CATEGORY_COLORS[c]}"></i>{_e(c)}</span>' for c in STACK_ORDER)
        + "</p>"
    )


def _table(
    header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = (), row_attrs: Sequence[str] | None = None
) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for r_i, r in enumerate(rows):
        cells = "".join(f"<td{' class=num' if i in numeric else ''}>{c}</td>" for i, c in enumerate(r))
        attrs = row_attrs[r_i] if row_attrs else ""
        body.append(f"<tr{attrs}>{cells}</tr>")
    return f'<table class="xp-tbl"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def explain_section(view: ExplainView, heading: str = "h2", prefix: str = "") -> str:
    """The explain part of a page: summary, categories, charts, sites, map, what-ifs (HTML, no script)."""
    ex = view.explanation
    mo = ex.moment
    parts = [
        f"<{heading}>Where the memory goes: {_e(ex.source)}</{heading}>",
        f'<p class="verdict">{_e(mo["reason"])} at event {_e(mo["event"])}: reserved {_fmt(mo["reserved"])}, '
        f"allocated {_fmt(mo['allocated'])}</p>",
        f'<p class="muted">repetitions: {_e(ex.repeats.get("count"))} ({_e(ex.repeats.get("how"))}); stacks: '
        f"{_e(ex.stacks)}; allocator state: {_e(ex.map_source)}. Hover the charts for numbers; click a site "
        "(row, line or block) to highlight its blocks.</p>",
    ]
    cat_rows = [
        (_e(c.name), _fmt(c.bytes), f"{100.0 * c.bytes / ex.reserved if ex.reserved else 0:.1f} %", str(c.blocks), _e(c.how))
        for c in ex.categories
    ]
    cat_rows.append(("<b>reserved</b>", f"<b>{_fmt(sum(c.bytes for c in ex.categories))}</b>", "100.0 %", "", ""))
    parts.append(_table(("category", "bytes", "share", "blocks", "how it was decided"), cat_rows, numeric=(1, 2, 3)))
    parts.append(
        f'<figure class="xp">{categories_svg(view).decode()}{_legend()}<figcaption>Stacked by category at '
        f"{len(view.over_time.request)} points of the run; dashed: allocated; the line marks the explained "
        "moment.</figcaption></figure>"
    )
    if view.over_time.phases:
        parts.append(
            f'<figure class="xp">{phases_svg(view).decode()}{_phase_legend(view)}<figcaption>Stacked by '
            "the phase of the training step that made each live block (explain.phases: annotations, then "
            "frames); they sum to allocated.</figcaption></figure>"
        )
    site_rows, attrs = [], []
    colors = {row: SITE_COLORS[j % len(SITE_COLORS)] for j, (row, _) in enumerate(view.over_time.sites)}
    for i, s in enumerate(ex.sites):
        anchor = site_anchor(OTHER if s.site.startswith("(") and s.site.endswith("other sites)") else i, prefix)
        swatch = f'<i style="display:inline-block;width:.7rem;height:.7rem;background:{colors[i]}"></i> ' if i in colors else ""
        grow = f"{_fmt(s.bytes_per_repeat)}/rep" if s.growing else "no"
        site_rows.append(
            (
                f'{swatch}<a href="#{anchor}">{_e(s.site)}</a>',
                _e(s.library_frame or ""),
                _fmt(s.bytes),
                str(s.blocks),
                _fmt(s.outlived_bytes),
                grow,
                _fmt(s.min_budget_if_freed),
            )
        )
        attrs.append(f' class="site" id="{anchor}"')
    parts.append(f"<h3>Sites (live bytes at the {_e(ex.moment_name)}; {ex.sites_total} distinct)</h3>")
    parts.append(
        _table(
            ("site (your line)", "library frame", "live", "blocks", "kept", "grows", "min budget if freed"),
            site_rows,
            numeric=(2, 3, 4, 6),
            row_attrs=attrs,
        )
    )
    parts.append(f'<figure class="xp">{sites_svg(view, prefix).decode()}</figure>')
    parts.append(
        f'<figure class="xp">{segment_map_svg(view, prefix).decode()}{_legend()}<figcaption>The '
        f"allocator's segments at the {_e(ex.moment_name)}, not at the end ({_e(view.map_source)})."
        "</figcaption></figure>"
    )
    if ex.what_if or ex.min_budget is not None:
        parts.append("<h3>What if (simulated min budget)</h3>")
        rows = [("the recording as it ran", _fmt(ex.min_budget), "", "")]
        rows += [
            (_e(w.what), _fmt(w.min_budget), _fmt(w.saves), f"<code>{_e(w.command.splitlines()[-1])}</code>") for w in ex.what_if
        ]
        parts.append(_table(("what", "min budget", "saves", "reproduce"), rows, numeric=(1, 2)))
    from alloctune.report.remedies_html import remedies_section

    parts.append(remedies_section(ex.remedies, ex.utilization))
    notes = list(ex.notes) + list(view.notes)
    if notes:
        parts.append("<ul>" + "".join(f'<li class="muted">{_e(n)}</li>' for n in notes) + "</ul>")
    return "\n".join(parts)


def explain_page(view: ExplainView, generated: datetime | None = None) -> str:
    """The standalone page of `alloctune explain --html`: one file, nothing fetched, no script."""
    from alloctune.report.style import PAGE_CSS as _CSS

    when = (generated or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    title = f"alloctune explain: {view.explanation.source}"
    return (
        "\n".join(
            [
                "<!DOCTYPE html>",
                '<html lang="en"><head><meta charset="utf-8">',
                '<meta name="viewport" content="width=device-width, initial-scale=1">',
                f"<title>{_e(title)}</title><style>{_CSS}{EXPLAIN_CSS}{highlight_css(view)}</style></head><body>",
                f'<h1>alloctune explain</h1><p class="muted">Generated {when}.</p>',
                explain_section(view),
                "</body></html>",
            ]
        )
        + "\n"
    )


def write_explain_html(recording, path, **kwargs):  # noqa: ANN001, ANN003 - see explain_recording
    """`alloctune explain REC --html FILE`: the explanation (as `explain` computes it, the same
    options) and its page; returns the `Explanation`."""
    from pathlib import Path

    from alloctune.errors import InputError
    from alloctune.report.explain_view import explain_recording

    out = Path(path)
    if out.is_dir():
        raise InputError(f"--html {out}: is a directory; give a file name such as explain.html")
    view = explain_recording(recording, **kwargs)
    try:
        out.write_text(explain_page(view), encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror}") from None
    return view.explanation
