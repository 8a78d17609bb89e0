"""The pages of ``patchword report``: its tables (and figures) as Markdown and as one self-contained HTML
file (the figures embedded).

A table is ``(caption, header, rows)``, or ``(caption, header, rows, notes)`` where lines belong under it
(footnotes its cells mark, as ``[1]``): the caption says what every row is, a note what one row's mark
means."""

from __future__ import annotations

import base64
import html
from pathlib import Path

__all__ = ["Table", "html_page", "markdown_page"]

#: (caption, header, rows) or (caption, header, rows, notes): the notes are lines shown under the table.
Table = tuple[str, list[str], list[list[str]]] | tuple[str, list[str], list[list[str]], list[str]]


def _notes(table: Table) -> list[str]:
    return list(table[3]) if len(table) > 3 else []


def markdown_page(tables: list[Table], figures: list[tuple[str, Path]]) -> str:
    lines = ["# patchword report"]
    for table in tables:
        caption, header, rows = table[:3]
        lines += ["", caption + ":", ""]
        if not rows:
            lines.append("none")
            continue
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        for note in _notes(table):  # each its own paragraph: a blank line ends the table
            lines += ["", note]
    for alt, path in figures:
        lines += ["", f"![{alt}]({path.name})"]
    return "\n".join(lines) + "\n"


def html_page(tables: list[Table], figures: list[tuple[str, Path]]) -> str:
    parts = [
        "<!doctype html><meta charset=utf-8><title>patchword report</title>",
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;border-bottom:1px solid #ddd}</style>",
        "<h1>patchword report</h1>",
    ]
    for table in tables:
        caption, header, rows = table[:3]
        parts.append(f"<h3>{html.escape(caption)}</h3>")
        if not rows:
            parts.append("<p>none</p>")
            continue
        parts.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows]
        parts.append("</table>")
        parts += [f"<p>{html.escape(note)}</p>" for note in _notes(table)]
    for alt, path in figures:
        data = base64.b64encode(path.read_bytes()).decode()
        parts.append(f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">')
    return "\n".join(parts) + "\n"
