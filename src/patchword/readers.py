"""Reading the files a user hands in: one reader per kind, every failure one :class:`DataError` naming the
file and what is wrong with it.

The verbs (eval, export, train --resume, index build, import, report, search, serve) read checkpoints, run
directories, JSON summaries, JSONL logs, sweep manifests and index manifests through these functions, so a
damaged, empty, truncated or misplaced file is always the same kind of one-line error (exit code 2 at the
command line), never a ``KeyError`` from inside a parser.

* :func:`read_checkpoint`: a ``torch.save`` file, read with the restricted (``weights_only``) unpickler;
* :func:`read_json`: one JSON document of an expected shape (an object, a list);
* :func:`read_json_lines`: a JSONL log; a last line cut short by a kill is dropped, any other bad line named
  with its row;
* :func:`read_yaml_mapping`: a YAML file holding a mapping;
* :func:`require_file`: the check the readers (and every other reader of a file the user names) make first,
  so a directory in a file's place and a missing file are told in the same words everywhere.
"""

from __future__ import annotations

import json
import pickle
import re
import warnings
import zipfile
from collections.abc import Iterable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from patchword.errors import DataError, MissingFileError

__all__ = [
    "require_file",
    "read_checkpoint",
    "read_safetensors",
    "read_json",
    "read_json_lines",
    "read_yaml_mapping",
    "describe_content",
]

# the PROTO opcode: every pickle of protocol 2 or later (torch's legacy format) starts with it
_PICKLE_START = b"\x80"
_ZIP_START = b"PK"  # torch's zip format


def _head(path: Path, size: int) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(size)


def require_file(path: str | Path, what: str, hint: str | None = None) -> None:
    """Check that ``path`` is a file, telling a directory in its place apart from a missing file.

    Args:
        path: the file the user named.
        what: what it should be, for the message (``checkpoint``, ``config file``, ``--gallery``).
        hint: what to do, appended after a colon to either message (``--vocab names ...``).

    Raises:
        MissingFileError: ``"{what} {path} is a directory, not a file[: {hint}]"`` or
            ``"{what} {path} does not exist[: {hint}]"``.
    """
    path = Path(path)
    tail = f": {hint}" if hint else ""
    if path.is_dir():
        raise MissingFileError(f"{what} {path} is a directory, not a file{tail}")
    if not path.is_file():
        raise MissingFileError(f"{what} {path} does not exist{tail}")


def describe_content(path: Path, limit: int = 24) -> str:
    """What a file that is not what it should be looks like: ``empty``, ``text starting 'hello'``,
    ``binary data`` (for error messages)."""
    try:
        head = _head(path, limit)
    except OSError:
        return "unreadable"
    if not head:
        return "empty"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return "binary data"
    first = text.splitlines()[0] if text.splitlines() else text
    return f"text starting {first[:limit]!r}"


def _checkpoint_problem(path: Path, err: BaseException) -> str:
    """Why ``torch.load`` failed on ``path``, in words a user can act on."""
    size = path.stat().st_size
    if size == 0:
        return "the file is empty"
    head = _head(path, len(_ZIP_START))
    if head == _ZIP_START:
        if not zipfile.is_zipfile(path):
            return f"the archive is truncated or damaged ({size} bytes; copy or download it again)"
        return f"the archive is damaged ({_first_line(err)})"
    if not head.startswith(_PICKLE_START):
        return f"it is not a PyTorch file ({describe_content(path)})"
    return f"a damaged or truncated legacy PyTorch file ({_first_line(err) or type(err).__name__})"


def _first_line(err: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip()  # torch colours some of its messages
    return text.splitlines()[0] if text else ""


def read_checkpoint(
    path: str | Path,
    map_location: Any = "cpu",
    *,
    what: str = "checkpoint",
    require: Iterable[str] = (),
    safe_globals: Iterable[Any] = (),
) -> dict[str, Any]:
    """A ``torch.save`` file as a dict, read with torch's restricted unpickler (tensors and containers,
    plus the classes in ``safe_globals``).

    Args:
        path: the file.
        map_location: where tensors go (``torch.load``'s argument).
        what: what the file should be, for messages (``training checkpoint``, ``official SEPS checkpoint``).
        require: top-level keys it must hold (``("model",)`` for a patchword training checkpoint).
        safe_globals: classes the file may name besides tensors and containers (``argparse.Namespace``).

    Raises:
        MissingFileError: no such file (or a directory).
        DataError: anything else: empty, text, truncated, a class outside the allow-list, not a mapping, a
            required key missing; the message names the file. A stop signal that interrupts the read
            (:class:`~patchword.errors.Interrupted`, KeyboardInterrupt) comes out as itself.
    """
    import torch

    path = Path(path)
    require_file(path, what)
    allowed = list(safe_globals)
    try:
        with (
            torch.serialization.safe_globals(allowed) if allowed else nullcontext(),
            warnings.catch_warnings(),
        ):
            # torch warns of any protocol above 2 before it tries; a failure is said below, in one line
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        protocol = _pickle_protocol(path)
        if protocol is not None and protocol > 2 and "Unsupported operand" in str(err):
            raise DataError(_protocol_problem(path, protocol, what)) from None
        # the restricted unpickler names a class it refuses: "GLOBAL module.Class was not an allowed global"
        named = re.search(r"GLOBAL (\S+)", str(err))
        if named is None and not _head(path, 2).startswith((_ZIP_START, _PICKLE_START)):
            raise DataError(f"{path}: not a {what}: {_checkpoint_problem(path, err)}") from None
        refused = f" ({named.group(1)})" if named else ""
        raise DataError(
            f"{path}: refused to unpickle a class{refused}: a {what} may hold tensors, containers"
            f"{' and ' + ', '.join(c.__qualname__ for c in allowed) if allowed else ''} only"
        ) from None
    except MemoryError:  # no damaged file (a stop signal's Interrupted is no Exception: it passes as it is)
        raise
    except Exception as err:  # torch's loaders raise KeyError, IndexError, OSError(EINVAL)... on garbage
        raise DataError(f"{path}: not a readable {what}: {_checkpoint_problem(path, err)}") from None
    if not isinstance(state, dict):
        raise DataError(f"{path}: not a {what}: it holds a {type(state).__name__}, not a mapping")
    _check_zip_members(path, what)
    missing = [key for key in require if key not in state]
    if missing:
        keys = ", ".join(sorted(map(str, state))[:8]) or "none"
        raise DataError(f"{path}: not a {what}: no {', '.join(map(repr, missing))} entry (its keys: {keys})")
    return state


def _pickle_protocol(path: Path) -> int | None:
    """The pickle protocol a ``torch.save`` file was written with (its first opcode, PROTO n), or None."""
    head = _head(path, 2)
    if head.startswith(_ZIP_START):
        try:
            with zipfile.ZipFile(path) as archive:
                name = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
                head = archive.open(name).read(2) if name else b""
        except (zipfile.BadZipFile, OSError):
            return None
    return head[1] if len(head) == 2 and head.startswith(_PICKLE_START) else None


def _protocol_problem(path: Path, protocol: int, what: str) -> str:
    """Why a file saved with ``torch.save(..., pickle_protocol=protocol)`` cannot be read, and the way out."""
    return (
        f"{path}: saved with pickle protocol {protocol}, which torch's restricted loader (weights_only) "
        f"cannot read, and patchword reads a {what} with nothing else (a pickle can run code). If you trust "
        f"the file, re-save it with torch's default protocol: python -c \"import torch; "
        f"torch.save(torch.load('{path}', weights_only=False), 'resaved.pth')\""
    )


def _check_zip_members(path: Path, what: str) -> None:
    """Refuse a ``torch.save`` archive with a damaged member: torch.load does not check the CRC32 each zip
    member records, so flipped bytes inside a tensor load as other weights without an error (a copy cut
    short is caught; a corrupted one was not). Reading the file once more costs ~1 s per GB."""
    import zipfile

    if not _head(path, len(_ZIP_START)).startswith(_ZIP_START):
        return  # the legacy (pre-1.6) format: a plain pickle stream with no checksums to test
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError) as err:
        raise DataError(f"{path}: not a readable {what}: {err}") from None
    if damaged is not None:
        raise DataError(
            f"{path}: not a readable {what}: its member {damaged} fails its CRC check (the file is damaged: "
            "copy it again)"
        )


def read_safetensors(path: str | Path, what: str = "weights file") -> dict[str, Any]:
    """The tensors of a ``.safetensors`` file (on the CPU).

    Raises:
        MissingFileError: no such file.
        DataError: not a safetensors file (empty, truncated, another format); the message names the file.
    """
    from safetensors.torch import load_file

    path = Path(path)
    require_file(path, what)
    try:
        return load_file(str(path))
    except MemoryError:
        raise
    except Exception as err:  # SafetensorError, or OSError from the memory map of a damaged file
        detail = "the file is empty" if path.stat().st_size == 0 else _first_line(err) or type(err).__name__
        raise DataError(f"{path}: not a readable {what} (safetensors): {detail}") from None


def _read_text(path: Path, what: str) -> str:
    require_file(path, what)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DataError(_not_utf8(path, what)) from None


def _not_utf8(path: Path, what: str) -> str:
    """Where a file that is not UTF-8 text stops being it: ``path:LINE: not a WHAT: ...`` (a file that is
    binary from its first byte is described as a whole)."""
    raw = path.read_bytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start == 0:
            return f"{path}: not a {what}: {describe_content(path)}"
        line = raw.count(b"\n", 0, err.start) + 1
        return (
            f"{path}:{line}: not a {what}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start})"
        )
    return f"{path}: not a {what}: not UTF-8 text"  # changed while it was read


_SHAPES = {dict: "a JSON object", list: "a JSON list"}
_MISSING = object()


def read_json(path: str | Path, what: str, *, expect: type = dict, default: Any = _MISSING) -> Any:
    """The JSON document in ``path``, which must be of type ``expect`` (an object, by default).

    ``default`` is returned when the file does not exist (without it, a missing file raises
    :class:`MissingFileError`). A damaged file is never taken for a missing one.

    Raises:
        DataError: not UTF-8, not JSON (the message gives line and column), or not of the expected shape.
    """
    path = Path(path)
    if default is not _MISSING and not path.exists():
        return default
    text = _read_text(path, what)
    if not text.strip():
        raise DataError(f"{path}: not a {what}: the file is empty")
    try:
        value = json.loads(text)
    except ValueError as err:
        raise DataError(f"{path}: not a {what}: invalid JSON ({err})") from None
    if not isinstance(value, expect):
        raise DataError(
            f"{path}: not a {what}: expected {_SHAPES.get(expect, expect.__name__)}, "
            f"found {_json_kind(value)}"
        )
    return value


def _json_kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def read_json_lines(path: str | Path, what: str) -> list[dict[str, Any]]:
    """The records (JSON objects, one per line) of a JSONL log; ``[]`` when the file does not exist.

    A last line that is not a complete record (a kill during the append) is dropped, as the writers do on
    resume; any other line that is not a JSON object is an error naming its row.
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = _read_text(path, what).splitlines()
    records = []
    for row, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            if row == len(lines):
                break  # torn by a kill while it was appended
            raise DataError(f"{path}:{row}: not a {what} record: invalid JSON ({err})") from None
        if not isinstance(record, dict):
            raise DataError(
                f"{path}:{row}: not a {what} record: expected a JSON object, found {_json_kind(record)}"
            )
        records.append(record)
    return records


def _unique_key_loader():
    """A ``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last one
    silently: ``train:`` twice would drop the first section's settings without a word)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {key!r} given twice (first at line {seen[key] + 1})",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def read_yaml_mapping(path: str | Path, what: str) -> dict[str, Any]:
    """The mapping in a YAML file (an empty file is ``{}``); a key given twice in one mapping is an error."""
    import yaml

    path = Path(path)
    text = _read_text(path, what)
    try:
        value = yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise DataError(f"{path}: not a {what}: invalid YAML{line} ({problem})") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DataError(f"{path}: not a {what}: expected a mapping, found {type(value).__name__}")
    return value
