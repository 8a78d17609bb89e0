"""The table of a ``patchword bench gallery --json`` file in ``patchword report --gallery FILE``."""

from __future__ import annotations

from pathlib import Path

from patchword.errors import DataError
from patchword.readers import read_json

__all__ = ["gallery_rows"]


def gallery_rows(path: Path) -> tuple[str, list[str], list[list[str]]]:
    """The table of a ``patchword bench gallery --json`` file: (caption, header, rows); extrapolated
    rows say so."""
    record = read_json(path, "gallery benchmark", expect=dict)
    needed = ("images", "captions", "seconds", "pairs_per_s", "peak_host_mb", "extrapolated")
    if record.get("kind") != "gallery" or not isinstance(record.get("rows"), list):
        raise DataError(f"{path}: not a `patchword bench gallery --json` file (kind {record.get('kind')!r})")
    for i, r in enumerate(record["rows"], start=1):
        missing = [k for k in needed if not isinstance(r, dict) or k not in r]
        if missing:
            raise DataError(f"{path}: row {i} lacks {', '.join(missing)}")
    rows = []
    for r in record.get("rows", []):
        measured = (
            "extrapolated from {:,} pairs".format(r.get("pairs_scored", 0))
            if r["extrapolated"]
            else "measured"
        )
        peak = r.get("peak_device_mb")
        rows.append(
            [
                f"{r['images']:,} x {r['captions']:,}",
                f"{r['seconds']:.1f}",
                f"{r['pairs_per_s']:,.0f}",
                ""
                if r["peak_host_mb"] is None
                else f"{r['peak_host_mb']:,.0f}"
                + ("" if r.get("peak_host_scope") == "shape" else " (process)"),
                "" if peak is None else f"{peak:,.0f}",
                measured,
            ]
        )
    machine = record.get("machine", {})
    caption = (
        f"Gallery scale ({path.name}: {record.get('config')}, device {record.get('device')}, "
        f"CPU {machine.get('cpu', '?')}, budget {record.get('max_memory_mb')} MiB)"
    )
    header = ["images x captions", "seconds", "pairs/s", "peak host MiB", "peak device MiB", ""]
    return caption, header, rows
