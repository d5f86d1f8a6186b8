"""What the PNG (`figures.py`) and SVG (`svg.py`) renderers share, so both draw the same pictures.

One place for the colours, the panel/row limits and the axis unit: the page must look the
same whether or not matplotlib is installed.
"""

from __future__ import annotations

from alloctune.units import GiB, MiB

ALLOCATED = "#2b6cb0"
RESERVED = "#dd6b20"
FREE = "#f6e05e"
LARGEST_FREE = "#38a169"
MAX_SEGMENT_ROWS = 48  # segments drawn per memory map (the largest ones)
MAX_PANELS = 12  # runs drawn per figure


def axis_unit(max_bytes: int) -> tuple[float, str]:
    """The unit to label an axis in: GiB from 2 GiB up, else MiB."""
    return (GiB, "GiB") if max_bytes >= 2 * GiB else (MiB, "MiB")


# The report pages' base style (report.html and the explain page both use it).
PAGE_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 72rem;
       padding: 0 1rem; color: #1a202c; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #cbd5e0; padding-bottom: .2rem; }
h3 { font-size: 1rem; }
table { border-collapse: collapse; margin: .6rem 0; font-size: .85rem; }
th, td { border: 1px solid #cbd5e0; padding: .25rem .5rem; text-align: left; vertical-align: top; }
th { background: #edf2f7; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.kv td:first-child { font-weight: 600; background: #f7fafc; }
figure { margin: 1rem 0; }
figure img, figure svg { max-width: 100%; height: auto; border: 1px solid #e2e8f0; }
figcaption { font-size: .85rem; color: #4a5568; }
.verdict { font-weight: bold; }
.muted { color: #718096; font-size: .85rem; }
code { background: #edf2f7; padding: 0 .2rem; }
"""
