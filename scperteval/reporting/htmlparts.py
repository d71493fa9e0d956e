"""HTML building blocks: tables of cells or of a data frame, lists, embedded PNGs, the page."""

from __future__ import annotations

import base64
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from html import escape
from typing import Any

import pandas as pd

from scperteval.reporting.formatting import DAGGER, is_missing, number

# A table cell: its text and its class ("" for none).
Cell = tuple[str, str]


def _class(klass: str) -> str:
    return f' class="{klass}"' if klass else ""


def row(cells: Sequence[Cell], tag: str = "td", row_class: str = "") -> str:
    """A table row of ``tag`` cells holding the (escaped) texts, with their classes."""
    attr = _class(row_class)
    inner = "".join(f"<{tag}{_class(klass)}>{escape(text)}</{tag}>" for text, klass in cells)
    return f"<tr{attr}>{inner}</tr>"


def table(
    header: Sequence[Cell],
    rows: Sequence[tuple[Sequence[Cell], str]],
    table_id: str = "",
    klass: str = "",
    extra_header: str = "",
) -> str:
    """A scrolling table: a header row, body rows (cells, row class), further header HTML.

    Parameters
    ----------
    header
        The header cells.
    rows
        Each body row's cells and class.
    table_id, klass
        The table's ``id`` and ``class`` (none when empty).
    extra_header
        HTML rows appended to the header.

    Returns
    -------
    str
        The table, in a ``<div class="scroll">``.

    """
    attr = (f' id="{table_id}"' if table_id else "") + _class(klass)
    body = "\n".join(row(cells, row_class=klass) for cells, klass in rows)
    return (
        f'<div class="scroll"><table{attr}>\n<thead>{row(header, "th")}{extra_header}</thead>\n'
        f"<tbody>\n{body}\n</tbody></table></div>"
    )


def frame_table(
    frame: pd.DataFrame,
    formats: Mapping[str, str],
    cell_class: Callable[[str, Any], str] = lambda column, value: "",
    row_class: Callable[[Any], str] = lambda row: "",
    table_class: str = "",
) -> str:
    """A data frame as a table: columns in ``formats`` as numbers, the others as text.

    Parameters
    ----------
    frame
        The table to show.
    formats
        Format spec (:func:`~scperteval.reporting.formatting.number`) per numeric column.
    cell_class, row_class
        Extra class of a cell (from its column and value) and of a row (from its record).
    table_class
        The table's class.

    Returns
    -------
    str
        The HTML table.

    """
    columns = [str(c) for c in frame.columns]
    header = [(c, "" if c in formats else "text") for c in columns]
    rows = []
    for record in frame.to_dict("records"):
        cells = []
        for column in columns:
            value = record[column]
            if column in formats:
                text, klass = number(value, formats[column]), ""
            else:
                text, klass = ("" if is_missing(value) else str(value)), "text"
            extra = cell_class(column, value)
            cells.append((text, f"{klass} {extra}".strip()))
        rows.append((cells, row_class(record)))
    return table(header, rows, klass=table_class)


def list_items(lines: Iterable[str]) -> str:
    """HTML list items holding ``lines`` (escaped)."""
    return "".join(f"<li>{escape(line)}</li>" for line in lines)


def named_items(
    pairs: Iterable[tuple[str, str]], attributes: str = "", marked: Container[str] = ()
) -> str:
    """List items ``name: text``, the name in bold and followed by a dagger when marked."""
    return "".join(
        f"<li{attributes}><strong>{escape(name)}</strong>{' ' + DAGGER if name in marked else ''}"
        f": {escape(text)}</li>"
        for name, text in pairs
    )


def html_page(title: str, css: str, body: str, footer: str, head: str = "") -> str:
    """A whole HTML document: ``title`` as heading, then ``body``, then ``footer``.

    Parameters
    ----------
    title
        The page's title and first heading.
    css
        The inline style sheet.
    body
        HTML after the heading.
    footer
        HTML of the footer.
    head
        Further HTML in the head, before the title.

    Returns
    -------
    str
        The document.

    """
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n{head}'
        f"<title>{title}</title>\n<style>{css}</style>\n</head>\n<body>\n"
        f"<h1>{title}</h1>\n{body}\n<footer>{footer}</footer>\n</body>\n</html>\n"
    )


def png_source(png: bytes) -> str:
    """A PNG as a data URI, for an ``img`` element's ``src``."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
