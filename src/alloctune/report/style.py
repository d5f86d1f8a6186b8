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
