"""The table of a ``patchword bench gallery --json`` file in ``patchword report --gallery FILE``."""

from __future__ import annotations

from pathlib import Path

from patchword.errors import DataError
from patchword.experiments.fields import FLAG, MAPPING, NUMBER, TEXT, check_fields
from patchword.readers import read_json

__all__ = ["gallery_rows"]

#: The fields of the file and of each of its rows the table reads.
_FILE_FIELDS = {
    "machine": MAPPING,
    "machine.cpu": TEXT,
    "machine.device_name": TEXT,
    "machine.torch_threads": NUMBER,
    "device": TEXT,
    "max_memory_mb": NUMBER,
}
_ROW_FIELDS = {
    "images": NUMBER,
    "captions": NUMBER,
    "seconds": NUMBER,
    "pairs_per_s": NUMBER,
    "peak_host_mb": NUMBER,
    "peak_host_scope": TEXT,
    "peak_device_mb": NUMBER,
    "pairs_scored": NUMBER,
    "extrapolated": FLAG,
}
_NEEDED = ("images", "captions", "seconds", "pairs_per_s", "peak_host_mb", "extrapolated")


def gallery_rows(path: Path) -> tuple[str, list[str], list[list[str]]]:
    """The table of a ``patchword bench gallery --json`` file: (caption, header, rows); extrapolated
    rows say so. The caption names the machine: the GPU (``machine.device_name``) where the device is
    not the CPU, the CPU and the torch threads the benchmark ran with (times on one CPU differ with them)."""
    record = read_json(path, "gallery benchmark", expect=dict)
    if record.get("kind") != "gallery" or not isinstance(record.get("rows"), list):
        raise DataError(f"{path}: not a `patchword bench gallery --json` file (kind {record.get('kind')!r})")
    check_fields(record, _FILE_FIELDS, str(path))
    for i, r in enumerate(record["rows"], start=1):
        if not isinstance(r, dict):
            raise DataError(f"{path}: row {i} is not an object")
        # a row's peak host memory is null where it could not be measured; every other figure is needed
        needed = [k for k in _NEEDED if k != "peak_host_mb"]
        check_fields(r, _ROW_FIELDS, f"{path}: row {i}", required=_NEEDED, not_null=needed)
    rows = []
    for r in record["rows"]:
        scored = r.get("pairs_scored")
        if not r["extrapolated"]:
            measured = "measured"
        else:  # a file without the count it was extrapolated from says so, never "from 0 pairs"
            measured = "extrapolated" if scored is None else f"extrapolated from {scored:,.0f} pairs"
        peak = r.get("peak_device_mb")
        rows.append(
            [
                f"{r['images']:,.0f} x {r['captions']:,.0f}",
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
    machine = record.get("machine") or {}
    threads = machine.get("torch_threads")
    threads_text = "?" if threads is None else f"{threads:g}"
    device = str(record.get("device"))
    # a GPU's times are the GPU's: named first (machine.device_name), the host CPU after it
    where = f"CPU {machine.get('cpu', '?')}"
    if device.split(":")[0] != "cpu":
        where = f"{machine.get('device_name') or '?'} (host {where})"
    caption = (
        f"Gallery scale ({path.name}: {record.get('config')}, device {device}, {where}, "
        f"{threads_text} torch thread{'' if threads == 1 else 's'}, budget {record.get('max_memory_mb')} MiB)"
    )
    stopped = record.get("interrupted")
    if isinstance(stopped, dict):  # a run stopped by a signal kept its finished shapes' rows only
        cut = f" in shape {stopped['shape']}" if stopped.get("shape") else ""
        caption += f"; INTERRUPTED by {stopped.get('signal', 'a signal')}{cut}: the finished shapes only"
    header = ["images x captions", "seconds", "pairs/s", "peak host MiB", "peak device MiB", ""]
    return caption, header, rows
