"""The one table factory and console settings every command renders with.

Why not plain `rich.table.Table`: when a table is wider than the terminal, rich shrinks
columns below their longest word and then folds or ellipsizes ("nat…", "expandable_seg /
ments"), which loses exactly the text users copy (setting names, sizes). `FitTable` lays the
table out itself at render time, for the width it is given (a terminal, `COLUMNS`, or 80 when
piped):

* every column gets at least its longest unbreakable piece, so no word, number or setting
  name is ever cut; cells wrap on spaces, long values fold after `,` (then `:` `=` `/`);
* columns marked `nowrap` (sizes, counts) stay on one line;
* if even the minimum widths do not fit, each row is printed as `header: value` lines
  instead (the "stacked" layout), which fits any width.

Cells are plain `str` (never parsed as markup, so `[256:1]` survives) or `rich.text.Text`
when a cell needs a colour.

A command or a line of code the user copies never goes in a cell (a cell wraps at spaces, and a
paste of the wrapped lines is a broken command): it is printed on a line of its own with
`soft_wrap=True`, or returned as a `CopyLine` for `print_items`. The terminal may then wrap it on
screen, but a paste gives back the one line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Union

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

Cell = Union[str, Text, None]

# Console settings shared by all commands: no syntax highlighting of numbers in our text, no
# `:name:` emoji codes (settings contain colons), width from the terminal, else `COLUMNS`, else 80.
console = Console(highlight=False, emoji=False)
err_console = Console(stderr=True, highlight=False, emoji=False)

_SOFT_BREAK = re.compile(r"(?<=[,;])")  # fold a long value after a comma first
# then after the other separators of settings and paths, and after a `.`/`+` that joins names
# (`torch.cuda.x`, `native+cudaMallocAsync`) but never inside a number (`1.08`, `1e+10`)
_HARD_BREAK = re.compile(r"(?<=[,;:=/|])|(?<=[.+])(?=[A-Za-z_])")
_GAP = 2  # one space of padding plus the (blank) vertical rule between two columns


@dataclass(frozen=True)
class Col:
    """A column: its header (may contain "\\n"), alignment, and whether it may wrap."""

    header: str
    justify: str = "left"
    nowrap: bool = False
    style: str | None = None


def _pieces(token: str, pattern: re.Pattern[str]) -> list[str]:
    return [p for p in pattern.split(token) if p]


def min_width(text: str, *, nowrap: bool = False, hard: bool = False) -> int:
    """The narrowest width `text` can be wrapped to without cutting a word or number."""
    if nowrap:
        return max((len(line) for line in text.split("\n")), default=0)
    pattern = _HARD_BREAK if hard else _SOFT_BREAK
    return max((len(p) for tok in text.split() for p in _pieces(tok, pattern)), default=0)


def wrap_spans(text: str, width: int) -> list[tuple[int, int]]:
    """Line spans (start, end offsets into `text`) of `text` wrapped to `width`.

    Breaks at spaces; a token longer than the width is folded after `,`/`;`, then after
    `:`/`=`/`/`/`|` or a `.`/`+` before a letter; only a piece longer than the whole width is cut (that cannot happen
    inside a `FitTable`, whose widths are at least the longest piece).
    """
    width = max(1, width)
    spans: list[tuple[int, int]] = []
    offset = 0
    for para in text.split("\n"):
        line_start: int | None = None
        line_end = 0
        for m in re.finditer(r"\S+", para):
            start, end = offset + m.start(), offset + m.end()
            if line_start is not None and end - line_start <= width:
                line_end = end
                continue
            if line_start is not None:
                spans.append((line_start, line_end))
                line_start = None
            if end - start <= width:
                line_start, line_end = start, end
                continue
            for piece_start, piece_end in _fold(text, start, end, width):
                if line_start is not None and piece_end - line_start <= width:
                    line_end = piece_end
                    continue
                if line_start is not None:
                    spans.append((line_start, line_end))
                line_start, line_end = piece_start, piece_end
        spans.append((line_start, line_end) if line_start is not None else (offset, offset))
        offset += len(para) + 1
    return spans


def _fold(text: str, start: int, end: int, width: int) -> list[tuple[int, int]]:
    """Pieces of the token text[start:end], each at most `width` long if at all possible."""
    out: list[tuple[int, int]] = []
    pos = start
    for soft in _pieces(text[start:end], _SOFT_BREAK):
        parts = [soft] if len(soft) <= width else _pieces(soft, _HARD_BREAK)
        for part in parts:
            for i in range(0, len(part), width):  # last resort: a piece wider than the table
                chunk = part[i : i + width]
                out.append((pos, pos + len(chunk)))
                pos += len(chunk)
    return out


def wrap_text(cell: Cell, width: int) -> Text:
    """`cell` as a `Text` wrapped to `width` (styles kept)."""
    text = cell if isinstance(cell, Text) else Text("" if cell is None else str(cell))
    lines = [text[a:b] for a, b in wrap_spans(text.plain, width)]
    return Text("\n").join(lines)


def _plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else ("" if cell is None else str(cell))


class FitTable:
    """A table that never cuts a word: built like `rich.table.Table`, laid out when printed."""

    def __init__(self, *columns: Col | str, title: str | None = None, show_header: bool = True) -> None:
        self.columns = [c if isinstance(c, Col) else Col(c) for c in columns]
        self.title = title
        self.show_header = show_header
        self.rows: list[list[Cell]] = []

    def add_row(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    # -- layout --------------------------------------------------------------------------------
    def _texts(self, i: int) -> list[str]:
        head = [self.columns[i].header] if self.show_header else []
        return head + [_plain(r[i]) for r in self.rows]

    def _min(self, i: int, hard: bool) -> int:
        """Column i's narrowest width: its longest piece; a `nowrap` column's whole values (its
        header may still wrap between its words, "peak" over "reserved" above "1.40 GiB")."""
        col = self.columns[i]
        head = min_width(col.header, hard=hard) if self.show_header else 0
        cells = (min_width(_plain(r[i]), nowrap=col.nowrap, hard=hard) for r in self.rows)
        return max(head, max(cells, default=0))

    def widths(self, available: int) -> list[int] | None:
        """Column widths for `available` characters, or None when the table cannot fit."""
        n = len(self.columns)
        room = available - _GAP * (n - 1)
        maxima = [max((len(line) for t in self._texts(i) for line in t.split("\n")), default=1) or 1 for i in range(n)]
        for hard in (False, True):
            minima = [max(1, self._min(i, hard)) for i in range(n)]
            if sum(minima) <= room:
                return _share(minima, maxima, room)
        return None

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(1, options.max_width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        widths = self.widths(options.max_width)
        if widths is None:
            yield from self._stacked(options.max_width)
            return
        table = Table(
            title=self.title,
            show_header=self.show_header,
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            padding=(0, 1, 0, 0),
            title_justify="left",
            header_style="bold",
        )
        for col, w in zip(self.columns, widths):
            table.add_column(
                wrap_text(col.header, w), justify=col.justify, style=col.style, width=w, no_wrap=True, overflow="fold"
            )
        for row in self.rows:
            table.add_row(*(wrap_text(cell, w) for cell, w in zip(row, widths)))
        yield table

    def _stacked(self, width: int) -> RenderResult:
        """One `header: value` line group per row (empty fields left out): fits any width without cutting words."""
        out: list[Text] = []
        if self.title:
            out.append(wrap_text(Text(self.title, style="bold"), width))
        for k, row in enumerate(self.rows):
            if k:
                out.append(Text(""))
            for col, cell in zip(self.columns, row):
                if not _plain(cell).strip():
                    continue  # an empty field says nothing in this layout
                label = " ".join(col.header.split()) if self.show_header else ""
                value = wrap_text(cell, max(1, width - 2))
                value.stylize(col.style or "")
                if label and len(label) + 2 + max((len(x) for x in value.plain.split("\n")), default=0) <= width:
                    out.append(Text.assemble((f"{label}: ", "bold"), value))
                else:
                    if label:
                        out.append(wrap_text(Text(f"{label}:", style="bold"), width))
                    out.append(Text("\n").join(Text("  ") + line for line in value.split("\n")))
        yield Group(*out)


class CopyLine(Text):
    """A line the user copies into a shell or an editor (a command, a line of code), among a view's
    renderables: `print_items` prints it unbroken; printed any other way it wraps like any `Text`."""


def print_items(out: Console, items: Iterable[object]) -> None:
    """Print a view's renderables in order, each `CopyLine` unbroken (`soft_wrap`)."""
    for item in items:
        out.print(item, soft_wrap=isinstance(item, CopyLine))


def _share(minima: list[int], maxima: list[int], room: int) -> list[int]:
    """Give each column its minimum, then spread what is left towards each column's natural width."""
    widths = list(minima)
    spare = room - sum(widths)
    while spare > 0:
        wanting = [i for i in range(len(widths)) if widths[i] < maxima[i]]
        if not wanting:
            break
        # the narrowest column that still wraps gets the next character: short columns (names,
        # labels) reach their natural width first and the long text column wraps instead
        i = min(wanting, key=lambda j: widths[j])
        widths[i] += 1
        spare -= 1
    return widths


def kv_table(pairs: Iterable[tuple[str, Cell]], *, title: str | None = None) -> FitTable:
    """A two-column `what | value` table without a header (summaries such as `trace info`)."""
    t = FitTable(Col("what", style="bold"), Col("value"), title=title, show_header=False)
    for key, value in pairs:
        t.add_row(key, value)
    return t


def table(*columns: Col | str, title: str | None = None, rows: Sequence[Sequence[Cell]] = ()) -> FitTable:
    """Shorthand: a `FitTable` with these columns and rows."""
    t = FitTable(*columns, title=title)
    for r in rows:
        t.add_row(*r)
    return t
