"""The pages of ``patchword report``: its tables (and figures) as Markdown and as one self-contained HTML
file (the figures embedded)."""

from __future__ import annotations

import base64
import html
from pathlib import Path

__all__ = ["Table", "html_page", "markdown_page"]

Table = tuple[str, list[str], list[list[str]]]  # (caption, header, rows)


def markdown_page(tables: list[Table], figures: list[tuple[str, Path]]) -> str:
    lines = ["# patchword report"]
    for caption, header, rows in tables:
        lines += ["", caption + ":", ""]
        if not rows:
            lines.append("none")
            continue
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    for alt, path in figures:
        lines += ["", f"![{alt}]({path.name})"]
    return "\n".join(lines) + "\n"


def html_page(tables: list[Table], figures: list[tuple[str, Path]]) -> str:
    parts = [
        "<!doctype html><meta charset=utf-8><title>patchword report</title>",
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;border-bottom:1px solid #ddd}</style>",
        "<h1>patchword report</h1>",
    ]
    for caption, header, rows in tables:
        parts.append(f"<h3>{html.escape(caption)}</h3>")
        if not rows:
            parts.append("<p>none</p>")
            continue
        parts.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows]
        parts.append("</table>")
    for alt, path in figures:
        data = base64.b64encode(path.read_bytes()).decode()
        parts.append(f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">')
    return "\n".join(parts) + "\n"
