"""Plain text-file readers shared by the dataset loaders, and the assembly of a split from their output.

Every malformed input raises an error that names the file and, where it applies, the line or field, so a
broken download is diagnosed without a debugger.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from patchword.data.json_keys import unique_keys
from patchword.data.split import RetrievalSplit, TextOrigin
from patchword.errors import DataError

__all__ = [
    "read_lines",
    "DenseLine",
    "read_dense_lines",
    "load_dense_jsonl",
    "names_image",
    "check_dense_lines",
    "load_json",
    "require_file",
    "iter_lines",
    "resolve_images",
    "assemble_split",
    "first_repeat",
    "second_run",
    "line_origin",
    "captions_per_image_mismatch",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]


def require_file(path: PathLike, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(1-based line number, line without its newline)``.

    Iterating the text file splits on newlines only (universal newlines, like the official loaders);
    ``str.splitlines`` would also split on form feeds and Unicode separators and shift every later line.
    A UTF-8 byte order mark opening the file (Windows editors write one) is not part of the first line.

    Raises:
        DataError: the file is not valid UTF-8 (names the line and the byte offset in the file).
    """
    try:
        with path.open(encoding="utf-8-sig") as f:
            for lineno, line in enumerate(f, start=1):
                yield lineno, line.rstrip("\n")
    except UnicodeDecodeError as err:
        raise _not_utf8(path) from err


def _not_utf8(path: Path) -> DataError:
    """The error for a file that does not decode as UTF-8, located by line and byte offset in the file.

    A text reader decodes in chunks, so its ``UnicodeDecodeError`` counts bytes from the start of a chunk;
    the file is decoded again whole (only on this error path) to locate the bad byte.
    """
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        before = data[: err.start]
        # Count lines as the text reader does (universal newlines: \n, \r\n and a lone \r end a line).
        lineno = before.replace(b"\r\n", b"\n").replace(b"\r", b"\n").count(b"\n") + 1
        return DataError(
            f"{path} is not valid UTF-8: line {lineno}, byte 0x{data[err.start]:02x} at byte offset "
            f"{err.start} of the file ({err.reason}); save the file as UTF-8"
        )
    return DataError(f"{path}: not valid UTF-8")  # the file changed since the failed read


def read_lines(path: PathLike, what: str = "line") -> list[str]:
    """Read a one-item-per-line text file, stripping whitespace.

    Args:
        path: the text file.
        what: what a line holds (``"caption"``, ``"image id"``), used in error messages.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a line is empty after stripping (named by file and line number).
    """
    path = require_file(path, f"{what} file")
    lines = []
    for lineno, line in iter_lines(path):
        item = line.strip()
        if not item:
            raise ValueError(f"{path}:{lineno}: empty {what}")
        lines.append(item)
    return lines


def load_json(path: Path) -> object:
    """The parsed JSON of ``path`` (a UTF-8 byte order mark opening it is skipped).

    Raises:
        ValueError: malformed JSON (names the file and line); DataError: not UTF-8, or an object giving one
            key twice (names the file and the key).
    """
    try:
        with path.open(encoding="utf-8-sig") as f:
            return json.load(f, object_pairs_hook=unique_keys(path))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: malformed JSON at line {err.lineno}: {err.msg}") from err
    except UnicodeDecodeError as err:
        raise _not_utf8(path) from err


@dataclass(frozen=True)
class DenseLine:
    """One line of a dense caption file: its text and the image identity it records, if any.

    Attributes:
        lineno: 1-based line number in the file.
        text: the description, stripped.
        image_id: ``metadata.image_id`` (``patchword densify`` writes the dataset id of a LAPS split, the
            relative path for a folder); None when absent (the SEPS release records none).
        file: ``metadata.file``, the image file relative to the densified root; None when absent.
    """

    lineno: int
    text: str
    image_id: str | None
    file: str | None

    def identity(self) -> str:
        """How the line names its image, for error messages."""
        parts = [f"image_id {self.image_id!r}" if self.image_id is not None else ""]
        parts.append(f"file {self.file!r}" if self.file is not None else "")
        return ", ".join(p for p in parts if p)


def _metadata_field(metadata: object, key: str, path: Path, lineno: int) -> str | None:
    value = metadata.get(key) if isinstance(metadata, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise DataError(
            f"{path}:{lineno}: metadata.{key} is {value!r}, expected a non-empty string or integer"
        )
    return str(value)


def read_dense_lines(path: PathLike) -> list[DenseLine]:
    """Read SEPS dense captions: one ``{"text": ..., "model_id": ..., "metadata": {...}}`` per line.

    Lines stay in file order, which is image order in the SEPS release.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a line is blank, is not valid JSON, gives one key twice in an object (DataError), lacks a
            non-empty string ``text`` field (an empty one says what to do), or has a ``metadata.image_id`` /
            ``metadata.file`` that is not a string or an integer.
    """
    path = require_file(path, "dense caption file")
    lines = []
    for lineno, line in iter_lines(path):
        if not line.strip():
            raise ValueError(f"{path}:{lineno}: empty line (expected one JSON object per image)")
        try:
            record = json.loads(line, object_pairs_hook=unique_keys(f"{path}:{lineno}"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{lineno}: malformed JSON: {err.msg}") from err
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise ValueError(f"{path}:{lineno}: expected an object with a non-empty string field 'text'")
        metadata = record.get("metadata")
        image_id = _metadata_field(metadata, "image_id", path, lineno)
        file = _metadata_field(metadata, "file", path, lineno)
        if not text.strip():  # e.g. a model that described the image with nothing (older densify wrote it)
            of = f" (image {image_id!r})" if image_id is not None else ""
            raise ValueError(
                f"{path}:{lineno}: 'text' is empty{of}: every image needs a dense caption; write one into "
                "the line, or describe the images again into a new file with other settings (patchword "
                "densify --prompt, --sample or another model; it leaves out an empty description)"
            )
        lines.append(DenseLine(lineno, text.strip(), image_id, file))
    return lines


def load_dense_jsonl(path: PathLike) -> list[str]:
    """The texts of a SEPS dense caption file (:func:`read_dense_lines`), in file order."""
    return [line.text for line in read_dense_lines(path)]


def resolve_images(names: Sequence[str], image_root: PathLike | None, check_images: bool) -> list[str]:
    """Join relative image names to ``image_root`` and, if asked, check that every file exists.

    Without a root the names are returned unchanged (a text-only split).
    """
    if image_root is None:
        return list(names)
    root = Path(image_root)
    paths = [str(root / name) for name in names]
    if check_images:
        if not root.is_dir():
            raise FileNotFoundError(f"image root is not a directory: {root}")
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            shown = ", ".join(missing[:3])
            raise FileNotFoundError(
                f"{len(missing)} of {len(paths)} image files are missing under {root}, e.g. {shown} "
                "(set data.skip_bad_images=true to leave them and their captions out, or pass "
                "check_images=False to the loader to build the split anyway)"
            )
    return paths


def _names_same_file(image: str, file: str) -> bool:
    """Whether the split's image path (or relative name) ends with the relative path ``file``."""
    file_parts, image_parts = PurePosixPath(file).parts, PurePosixPath(Path(image).as_posix()).parts
    return 0 < len(file_parts) <= len(image_parts) and image_parts[-len(file_parts) :] == file_parts


def names_image(line: DenseLine, image_id: str, image: str) -> bool:
    """Whether a line's recorded identity names this image: by file where it records one, else by dataset id.
    A file naming another image decides even where the id matches (another dataset's ids ``0..N-1`` match
    any split's); a file equal to the id (as ``densify --images``, ``--synthetic`` write) pairs by either."""
    if line.file is not None and line.file != line.image_id:
        return _names_same_file(image, line.file)
    by_file = line.file is not None and _names_same_file(image, line.file)
    return by_file or (line.image_id is not None and line.image_id == image_id)


def _check_dense_identities(
    path: PathLike, lines: list[DenseLine], images: list[str], image_ids: list[str]
) -> None:
    """Refuse a line whose recorded image is not the split's image at its position.

    Lines without an identity (the SEPS release) are matched by order alone, as the official loaders do
    (logged: nothing shows that such a file belongs to this split). A file in another order is refused
    rather than reordered: the error shows where the order breaks.
    """
    by_order = sum(1 for line in lines if line.image_id is None and line.file is None)
    if by_order:
        logger.warning(
            "%s: %s record no image id (metadata.image_id or metadata.file), so line k is paired with "
            "image k of the split by order alone (as the SEPS release is read): check that the file was made "
            "for this split, in its image order",
            path,
            "its lines" if by_order == len(lines) else f"{by_order} of its {len(lines)} lines",
        )
    for k, line in enumerate(lines):
        if (line.image_id is None and line.file is None) or names_image(line, image_ids[k], images[k]):
            continue
        # Only on the error path: where the line's image sits in the split, if anywhere.
        where = next((j for j in range(len(images)) if names_image(line, image_ids[j], images[j])), None)
        hint = (
            f"; that is image {where} of the split, so the lines are in another order (a folder densify "
            "sorts by file name: densify the split itself, with --data-root ROOT --split S for a LAPS "
            "layout or --karpathy JSON --split S --image-root DIR for a Karpathy json)"
            if where is not None
            else "; it is not an image of this split (a dense file of another split?)"
        )
        if line.image_id == image_ids[k]:  # the id matches: the recorded file is the one that disagrees
            hint = (
                f"; its metadata.image_id is this image's id, but its metadata.file names another image{hint}"
            )
        raise DataError(
            f"{path}:{line.lineno}: the line describes {line.identity()}, but image {k} of the split is "
            f"id {image_ids[k]!r} ({images[k]}); dense captions must follow the split's image order{hint}"
        )


def check_dense_lines(
    path: PathLike,
    lines: list[DenseLine],
    images: list[str],
    image_ids: list[str],
    num_captions: int,
    gaps_ok: bool = False,
) -> list[DenseLine]:
    """The ``lines`` of ``path`` checked to be one per image and, where the lines record which image they
    describe, to describe the split's images in its order (``num_captions`` names a file of one line per
    caption; ``gaps_ok``: data.skip_bad_images could not place fewer lines, see ``data.dense_gaps``)."""
    if len(lines) != len(images):
        hint = ""
        if len(lines) == num_captions:
            hint = " (it has one line per caption; store one line per image, in image order)"
        elif len(lines) < len(images) and gaps_ok:
            hint = (
                " (data.skip_bad_images accepts lines missing for unusable images only when every line "
                "records its image, metadata.image_id or metadata.file, in the split's image order)"
            )
        elif len(lines) < len(images) and all(line.image_id or line.file for line in lines):
            hint = (
                " (lines missing for unusable images, as densify --skip-bad-images leaves out, are accepted "
                "with data.skip_bad_images=true)"
            )
        raise ValueError(
            f"{path}: {len(lines)} dense captions for a split of {len(images)} images; expected one line "
            f"per image in image order{hint}"
        )
    _check_dense_identities(path, lines, [str(i) for i in images], image_ids)
    return lines


def first_repeat(items: Sequence[str]) -> tuple[int, int] | None:
    """``(i, j)``, i < j, of the first ``items[j]`` equal to an earlier ``items[i]``; None if all differ."""
    first: dict[str, int] = {}
    for j, item in enumerate(items):
        if item in first:
            return first[item], j
        first[item] = j
    return None


def second_run(items: Sequence[str]) -> tuple[int, int] | None:
    """``(i, j)`` of the first ``items[j]`` that starts a second run of equal consecutive items, the first
    run of that item starting at ``i``; None when each distinct item forms one run (``a a b b``: None;
    ``a a b a``: ``(0, 3)``)."""
    start: dict[str, int] = {}
    for j, item in enumerate(items):
        if j and items[j - 1] == item:
            continue
        if item in start:
            return start[item], j
        start[item] = j
    return None


def captions_per_image_mismatch(per_image: int, captions_per_image: int, partial: str) -> str:
    """Why a split with one id (or feature row) per image and ``per_image`` captions each is refused when
    ``per_image != captions_per_image`` (``data.captions_per_image``), and the setting that accepts it.

    Args:
        partial: the file that may hold only part of the images (``"an ids file"``).
    """
    if per_image == 0:  # no count fixes it (data.captions_per_image=0 is refused)
        return "no captions at all; the captions file is empty"
    if per_image > captions_per_image:
        more = "more"
        why = f"{partial} of only part of the images would pair them with other images' captions"
    else:
        more, why = "fewer", "a captions file cut short would move captions onto other images"
    captions = f"{per_image} caption{'s' if per_image > 1 else ''}"
    return (
        f"{captions} per image, {more} than data.captions_per_image={captions_per_image}; {why}; set "
        f"data.captions_per_image={per_image} if each image has {captions}"
    )


def line_origin(path: PathLike, count: int) -> TextOrigin:
    """The origin of ``count`` texts read one per line from ``path`` by :func:`read_lines` (which refuses
    blank lines, so text ``i`` is line ``i + 1``)."""
    return TextOrigin(str(path), np.arange(1, count + 1, dtype=np.int64))


def assemble_split(
    name: str,
    images: list[str],
    captions: list[str],
    txt2img: np.ndarray,
    image_ids: list[str],
    dense_jsonl: PathLike | None,
    caption_origin: TextOrigin | None = None,
    image_id_fields: list[str] | None = None,
) -> RetrievalSplit:
    """The split of these images and captions, with the dense captions of ``dense_jsonl`` (checked to
    be one line per image, in image order: ``data.dense_gaps.attach_dense``), where each text was read and
    (``image_id_fields``) which field each image id was read from."""
    split = RetrievalSplit(
        name=name,
        images=images,
        captions=captions,
        txt2img=txt2img,
        image_ids=image_ids,
        caption_origin=caption_origin,
        image_id_fields=image_id_fields,
    )
    if dense_jsonl is not None:
        from patchword.data.dense_gaps import attach_dense  # it builds on this module's readers

        split = attach_dense(split, dense_jsonl)
    logger.info(
        "loaded split %r: %d images, %d captions%s",
        name,
        split.num_images,
        split.num_captions,
        "" if dense_jsonl is None else ", dense captions",
    )
    return split
