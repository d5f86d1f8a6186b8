"""One self-contained HTML page of an explanation (`alloctune explain --html FILE`).

Inline SVG and a few lines of script, nothing fetched: reserved and live bytes over the run with
the moment marked, the top sites' live bytes over the run (click a site to highlight its line),
the categories at the moment as one stacked bar, live bytes by category over the run (stacked) under
the recorded reserved line, the segment map at the moment, and the site and
what-if tables. Hover any mark for its numbers. Pure Python string building (no plotting library).
"""

from __future__ import annotations

import bisect
import html
import json
from typing import Any, Sequence

from alloctune.explain.core import Analysis, block_categories
from alloctune.explain.model import CATEGORIES, OVERHEAD, Explanation
from alloctune.explain.moment import reserved_after
from alloctune.units import format_size

W, H = 1180, 260  # chart size (px): reads at 1280 px wide
PAD_L, PAD_B = 80, 30
MAX_POINTS = 600
TOP_SERIES = 8
COLORS = {"model_state": "#4e79a7", "gradients": "#f28e2b", "optimizer_state": "#e15759", "activations": "#76b7b2",
          "growing": "#b07aa1", "cached_free": "#bab0ac", "inactive_split": "#edc948", "rounding": "#9c755f"}
SITE_COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1", "#9c755f", "#ff9da7", "#76b7b2")


def _bounds(n: int) -> list[int]:
    step = max(1, n // MAX_POINTS)
    return list(range(0, n, step)) + [n]


def _poly(xs: Sequence[float], ys: Sequence[float]) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))


def _axis(ymax: int, n: int, x0: float, y0: float, w: float, h: float, moment_x: float | None) -> list[str]:
    out = [f'<line x1="{x0}" y1="{y0}" x2="{x0 + w}" y2="{y0}" stroke="#333"/>',
           f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 - h}" stroke="#333"/>']
    for k in range(5):
        v = ymax * k / 4
        y = y0 - h * k / 4
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{html.escape(format_size(int(v)))}</text>')
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="#eee"/>')
    for k in range(6):
        x = x0 + w * k / 5
        out.append(f'<text x="{x:.1f}" y="{y0 + 16}" text-anchor="middle" font-size="11">{int(n * k / 5)}</text>')
    out.append(f'<text x="{x0 + w / 2}" y="{y0 + 28}" text-anchor="middle" font-size="11">allocator requests (index)</text>')
    if moment_x is not None:
        out.append(f'<line x1="{moment_x:.1f}" y1="{y0}" x2="{moment_x:.1f}" y2="{y0 - h}" stroke="#d00" '
                   f'stroke-dasharray="4 3"><title>the moment explained</title></line>')
    return out


def render(an: Analysis, ex: Explanation) -> str:
    """The page's HTML text."""
    trace, life = an.trace, an.life
    n = len(trace.requests)
    bounds = _bounds(n)
    res = reserved_after(trace)
    # per bucket: the highest reserved and live bytes in it (a peak never disappears when downsampled)
    res_pts = [max(res[a:b]) if b > a else 0 for a, b in zip(bounds, bounds[1:])]
    # live bytes are sampled where each bucket holds the most (a downsampled peak stays a peak); the
    # moment's bucket is sampled at the moment itself
    lb = an.live_before
    points = [max(range(a + 1, b + 1), key=lambda i: lb[i]) if b > a else a for a, b in zip(bounds, bounds[1:])]
    at = ex.moment["request"] + 1
    jm = min(len(points) - 1, max(0, bisect.bisect_right(bounds, at) - 1))
    points[jm] = at
    points = sorted(points)
    ymax = max(max(res_pts, default=1), 1)
    x0, y0, w, h = PAD_L, H - PAD_B, W - PAD_L - 20, H - PAD_B - 20
    xs = [x0 + w * (a / max(1, n)) for a in bounds[:-1]]
    pxs = [x0 + w * (p / max(1, n)) for p in points]
    sy = [y0 - h * v / ymax for v in res_pts]
    mx = x0 + w * (ex.moment["request"] + 1) / max(1, n)
    chart1 = _axis(ymax, n, x0, y0, w, h, mx)
    # live bytes by category, stacked, at each bucket boundary; the allocator's overhead on top up to reserved
    cats = block_categories(an)
    order = [c for c in CATEGORIES if c not in OVERHEAD]
    cdiff = {c: [0] * (len(points) + 1) for c in order}
    for k in range(len(life.alloc)):
        lo = bisect.bisect_right(points, life.alloc[k])
        hi = bisect.bisect_right(points, life.free[k])
        if lo < hi:
            d = cdiff[cats[k]]
            d[lo] += life.size[k]
            d[hi] -= life.size[k]
    base = [0] * len(points)
    for c in order:
        acc, top_pts = 0, []
        for j in range(len(points)):
            acc += cdiff[c][j]
            top_pts.append(base[j] + acc)
        if any(t != b for t, b in zip(top_pts, base)):
            upper = [y0 - h * v / ymax for v in top_pts]
            lower = [y0 - h * v / ymax for v in base]
            pts = _poly(pxs, upper) + " " + _poly(pxs[::-1], lower[::-1])
            chart1.append(f'<polygon points="{pts}" fill="{COLORS[c]}" fill-opacity="0.75" stroke="none">'
                          f'<title>{c} (live bytes)</title></polygon>')
        base = top_pts
    chart1.append(f'<polyline fill="none" stroke="#333" stroke-width="1.2" points="{_poly(xs, sy)}">'
                  f'<title>reserved (recorded): the gap above the stacked areas is the allocator overhead '
                  f'(cached free, inactive split, rounding)</title></polyline>')
    chart1.append(f'<circle cx="{mx:.1f}" cy="{y0 - h * ex.reserved / ymax:.1f}" r="4" fill="#d00">'
                  f'<title>{ex.moment["reason"]}: reserved {html.escape(format_size(ex.reserved))} at event '
                  f'{ex.moment["event"]}</title></circle>')
    # top sites over the run
    label_id = {lab: i for i, lab in enumerate(an.labels)}
    top = [s for s in ex.sites if s.site in label_id][:TOP_SERIES]
    idx = {label_id[s.site]: j for j, s in enumerate(top)}
    diff = [[0] * (len(points) + 1) for _ in top]
    for k, site in enumerate(an.site_of):
        j = idx.get(site)
        if j is None:
            continue
        lo = bisect.bisect_right(points, life.alloc[k])
        hi = bisect.bisect_right(points, life.free[k])
        if lo < hi:
            diff[j][lo] += life.size[k]
            diff[j][hi] -= life.size[k]
    series = []
    for d in diff:
        acc, pts = 0, []
        for v in d[:len(points)]:
            acc += v
            pts.append(acc)
        series.append(pts)
    smax = max((max(p, default=0) for p in series), default=1) or 1
    chart2 = _axis(smax, n, x0, y0, w, h, mx)
    for j, (s, pts) in enumerate(zip(top, series)):
        ys = [y0 - h * v / smax for v in pts]
        chart2.append(f'<polyline class="site s{j}" data-site="{j}" fill="none" stroke="{SITE_COLORS[j % len(SITE_COLORS)]}" '
                      f'stroke-width="1.5" points="{_poly(pxs, ys)}"><title>{html.escape(s.site)}</title></polyline>')
    # categories at the moment: one stacked bar
    bar, x = [], 0.0
    for c in ex.categories:
        if not c.bytes:
            continue
        cw = (W - 40) * c.bytes / max(1, ex.reserved)
        bar.append(f'<rect x="{20 + x:.1f}" y="10" width="{cw:.1f}" height="34" fill="{COLORS[c.name]}">'
                   f'<title>{c.name}: {html.escape(format_size(c.bytes))} ({100 * c.bytes / max(1, ex.reserved):.1f} %) - '
                   f'{html.escape(c.how)}</title></rect>')
        x += cw
    legend = "".join(f'<span class="lg"><i style="background:{COLORS[c.name]}"></i>{c.name} '
                     f'{html.escape(format_size(c.bytes))}</span>' for c in ex.categories)
    seg_svg = _segments(an, ex)
    site_rows = "".join(
        f'<tr class="site-row" data-site="{j if s.site in label_id and j < TOP_SERIES else -1}">'
        f'<td>{html.escape(s.site)}</td><td>{html.escape(s.library_frame or "")}</td>'
        f'<td class="r">{html.escape(format_size(s.bytes))}</td><td class="r">{s.blocks}</td>'
        f'<td class="r">{html.escape(format_size(s.outlived_bytes))}</td>'
        f'<td class="r">{html.escape(format_size(s.bytes_per_repeat)) + "/rep" if s.growing else ""}</td>'
        f'<td class="r">{html.escape(format_size(s.min_budget_if_freed)) if s.min_budget_if_freed else ""}</td></tr>'
        for j, s in enumerate(ex.sites))
    wi_rows = "".join(
        f'<tr><td>{html.escape(wi.what)}</td><td class="r">{html.escape(format_size(wi.min_budget)) if wi.min_budget else "-"}</td>'
        f'<td class="r">{html.escape(format_size(wi.saves)) if wi.saves and wi.saves > 0 else "-"}</td>'
        f'<td><code>{html.escape(wi.command.splitlines()[-1])}</code></td></tr>' for wi in ex.what_if)
    data = json.dumps({"moment": ex.moment}).replace("</", "<\\/")
    return _PAGE.format(
        title=html.escape(f"alloctune explain: {ex.source}"), source=html.escape(ex.source),
        reason=html.escape(ex.moment["reason"]), event=ex.moment["event"],
        reserved=html.escape(format_size(ex.reserved)), allocated=html.escape(format_size(ex.moment["allocated"])),
        W=W, H=H, chart1="\n".join(chart1), chart2="\n".join(chart2), bar="\n".join(bar), legend=legend,
        segments=seg_svg, site_rows=site_rows, wi_rows=wi_rows or '<tr><td colspan="4">none</td></tr>',
        min_budget=html.escape(format_size(ex.min_budget)) if ex.min_budget else "-",
        repeats=html.escape(f"{ex.repeats['count']} ({ex.repeats['how']})"), data=data)


def _segments(an: Analysis, ex: Explanation) -> str:
    """The segment map at the moment: one row of segments, blocks coloured allocated / free."""
    from alloctune.diagnose.memory_map import map_after_request
    from alloctune.errors import TraceError

    try:
        after = ex.moment["request"]
        event = an.trace.requests.event_index[after] if after >= 0 else -1  # right after that request
        mm, _ = map_after_request(an.trace, after, ex.moment["reserved"], event)
    except TraceError:
        return "<p>(the segment map is not available for this moment)</p>"
    total = max(1, mm.reserved)
    rects, x = [], 0.0
    width = W - 40
    shown = 0
    for s in mm.segments:
        for b in s.blocks:
            bw = width * b.size / total
            if shown < 5000:
                fill = "#4e79a7" if b.allocated else "#ddd"
                what = (f"allocated {format_size(b.size)} (requested {format_size(b.requested)})" if b.allocated
                        else f"free {format_size(b.size)}")
                rects.append(f'<rect x="{20 + x:.2f}" y="10" width="{max(bw, 0.3):.2f}" height="30" fill="{fill}">'
                             f'<title>{html.escape(what)} in segment {s.addr:#x} ({html.escape(format_size(s.size))})'
                             f'</title></rect>')
                shown += 1
            x += bw
        rects.append(f'<line x1="{20 + x:.2f}" y1="6" x2="{20 + x:.2f}" y2="44" stroke="#333" stroke-width="0.6"/>')
    return (f'<svg width="{W}" height="50" role="img" aria-label="segment map">' + "".join(rects) + "</svg>"
            f'<p class="note">{len(mm.segments)} segments, {html.escape(format_size(mm.reserved))} reserved; '
            "blue: allocated blocks, grey: free; widths proportional to bytes.</p>")


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body{{font:14px system-ui,sans-serif;margin:20px;max-width:1240px;color:#222}}
h1{{font-size:20px}} h2{{font-size:16px;margin-top:28px}}
table{{border-collapse:collapse;width:100%}} td,th{{border-bottom:1px solid #eee;padding:3px 6px;text-align:left;vertical-align:top}}
td.r,th.r{{text-align:right;white-space:nowrap}} .note{{color:#666;font-size:12px}}
.lg{{margin-right:14px;white-space:nowrap}} .lg i{{display:inline-block;width:11px;height:11px;margin-right:4px}}
.site{{cursor:pointer}} .site.hl{{stroke-width:4}} .site.dim{{opacity:.2}} tr.site-row{{cursor:pointer}} tr.sel{{background:#fff3c4}}
</style></head><body>
<h1>Where the memory goes: {source}</h1>
<p>{reason} at event {event}: reserved <b>{reserved}</b>, allocated {allocated}. Repetitions: {repeats}.
Min budget of the recording as it ran: {min_budget}.</p>
<h2>Categories at the moment (they sum to reserved memory)</h2>
<svg width="{W}" height="54" role="img" aria-label="categories">{bar}</svg><div>{legend}</div>
<h2>Over the run: live bytes by category (stacked) and reserved (line); the moment in red</h2>
<svg width="{W}" height="{H}" role="img" aria-label="reserved over time">{chart1}</svg>
<h2>Top sites: live bytes over the run (click a site or its row to highlight it)</h2>
<svg id="sites" width="{W}" height="{H}" role="img" aria-label="sites over time">{chart2}</svg>
<h2>Segment map at the moment</h2>
{segments}
<h2>Sites at the moment</h2>
<table><tr><th>site (your line)</th><th>library frame</th><th class="r">live</th><th class="r">blocks</th>
<th class="r">kept</th><th class="r">grows</th><th class="r">min budget if freed</th></tr>{site_rows}</table>
<h2>What-ifs (simulated)</h2>
<table><tr><th>what</th><th class="r">min budget</th><th class="r">saves</th><th>reproduce</th></tr>{wi_rows}</table>
<script id="data" type="application/json">{data}</script>
<script>
(function(){{
  function pick(j){{
    document.querySelectorAll('.site').forEach(function(p){{
      var on = p.getAttribute('data-site') === String(j);
      p.classList.toggle('hl', on); p.classList.toggle('dim', !on && j !== null);
    }});
    document.querySelectorAll('tr.site-row').forEach(function(r){{
      r.classList.toggle('sel', r.getAttribute('data-site') === String(j));
    }});
  }}
  document.querySelectorAll('.site').forEach(function(p){{
    p.addEventListener('click', function(){{ pick(p.getAttribute('data-site')); }});
  }});
  document.querySelectorAll('tr.site-row').forEach(function(r){{
    r.addEventListener('click', function(){{ var j = r.getAttribute('data-site'); if (j !== '-1') pick(j); }});
  }});
  var m = /site=(\\d+)/.exec(location.hash);  // #site=N: open with site N highlighted (links, tests)
  if (m) pick(m[1]);
}})();
</script>
</body></html>
"""
