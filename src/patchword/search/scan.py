"""Find the images under a folder by content, not by name.

A file is an image when Pillow recognises its header (``Image.open`` reads only the first bytes), so a
JPEG saved without an extension is found and a text file named ``x.jpg`` is not taken for one. What is
reported:

* images: sorted by relative POSIX path (the index order, deterministic across runs and machines);
* skipped: files that look like images (image extension) but cannot be opened, symbolic links leaving
  the folder (to a file or a folder), unreadable files, and files and folders whose name is not valid
  UTF-8 (an image's path is its id in the UTF-8 manifest and results), each with its reason;
* ignored: how many other files (not images) were passed over.

Hidden files and folders (names starting with ``.``) are not scanned: they hold tool state (``.git``,
an index written inside the folder), not a user's pictures. Symbolic links to files are followed only when
they stay inside the folder, so an index never reaches files the folder's owner did not put there; a
symbolic link to a folder is never followed (the folder it names is scanned under its own path when it is
inside, and the link is listed as skipped when it leads outside).
"""

from __future__ import annotations

import logging
import os
import unicodedata
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from patchword.errors import ConfigError, MissingFileError

__all__ = [
    "IMAGE_SUFFIXES",
    "ImageFile",
    "SkippedFile",
    "ScanResult",
    "check_image_folder",
    "printable",
    "scan_images",
    "file_signature",
]

logger = logging.getLogger(__name__)

#: Extensions that mark a file as meant to be an image: such a file that cannot be opened is reported as
#: skipped; other files Pillow does not recognise are simply not images.
IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm"}
    | {".ico", ".tga", ".jp2", ".j2k", ".avif", ".heic", ".heif", ".dib", ".pcx", ".sgi", ".psd"}
)


@dataclass(frozen=True)
class ImageFile:
    """One image found by :func:`scan_images`.

    Attributes:
        path: POSIX path relative to the scanned folder.
        size: bytes.
        mtime_ns: modification time in nanoseconds.
        format: Pillow's format name (``PNG``, ``JPEG``...).
    """

    path: str
    size: int
    mtime_ns: int
    format: str


@dataclass(frozen=True)
class SkippedFile:
    """A file left out of the index, with the reason (shown to the user and kept in the manifest).

    ``size`` and ``mtime_ns`` are set for files that were decoded: one that failed to decode, or one that
    decoded but has no dense caption (``uncaptioned``); an update or a resumed build does not decode such a
    file again until it changes (an uncaptioned one is encoded once the dense file has its caption).
    """

    path: str
    reason: str
    size: int | None = None
    mtime_ns: int | None = None
    uncaptioned: bool = False


@dataclass
class ScanResult:
    """Images found under a folder (sorted by path), files skipped with a reason, and other files ignored."""

    root: Path
    images: list[ImageFile] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)
    ignored: int = 0


def file_signature(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(size in bytes, mtime in ns)`` of a file (following a symbolic link): what tells a changed file."""
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def _sniff(path: Path) -> str | None:
    """Pillow's format name when the file's header is an image's, else None (reads a few bytes)."""
    with warnings.catch_warnings():
        # A huge image only warns here (DecompressionBombWarning); decoding it later is what is refused.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with Image.open(path) as image:
            return image.format


def _inside(path: Path, root: Path) -> bool:
    """Whether ``path`` (its links resolved) lies under ``root`` (resolved)."""
    # os.path.realpath, not Path.resolve: on Python < 3.13 the latter raises RuntimeError on a symbolic
    # link loop, which would stop the whole scan; a loop resolves to a path that is then no file.
    try:
        Path(os.path.realpath(path)).relative_to(root)
    except ValueError:
        return False
    return True


#: Characters a path is printed with escaped: control characters (C0, DEL, C1), lone surrogates, line and
#: paragraph separators, and the bidirectional overrides that reorder what a terminal shows.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")


def printable(path: str) -> str:
    """``path`` as one line of text output: the characters that would break or disguise the line
    (``new\\nline.png``, an escape sequence, a right-to-left override) escaped as ``repr`` writes them,
    everything else (accents, CJK, emoji) as it is. JSON output writes paths exactly instead."""
    if path.isprintable():
        return path
    return "".join(
        repr(c)[1:-1] if unicodedata.category(c) in _ESCAPED_CATEGORIES or c in _BIDI_CONTROLS else c
        for c in path
    )


#: Why a file (or folder) whose name is not UTF-8 is skipped: its path is the image's id, written to the
#: UTF-8 manifest and results, and Python holds such bytes as lone surrogates nothing can encode.
NOT_UTF8 = "file name is not valid UTF-8: rename it"
NOT_UTF8_FOLDER = "folder name is not valid UTF-8: rename it (its files were not scanned)"


def _not_utf8(rel: str) -> str | None:
    """A printable form of ``rel`` (undecodable bytes as ``\\xff``) when it is not valid UTF-8, else None."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        try:  # the bytes of the name (os.fsdecode's surrogateescape), undecodable ones shown as \xff
            return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a surrogate no file system byte gives: shown as \udxxx
            return rel.encode("utf-8", "backslashreplace").decode("utf-8")
    return None


def _subfolders(
    here: Path, names: list[str], root: Path, real_root: Path, excluded: Path | None, result: ScanResult
) -> list[str]:
    """The folders of ``names`` (under ``here``) to scan, sorted; those left out for a reason the user can
    act on (a name that is not UTF-8, a symbolic link leading outside ``root``) go to ``result.skipped``.

    A symbolic link to a folder inside ``root`` is not followed (os.walk's ``followlinks=False``) and not
    listed: the folder it names is scanned under its own path."""
    kept = []
    for name in sorted(names):
        path = here / name
        if name.startswith(".") or (excluded is not None and Path(os.path.realpath(path)) == excluded):
            continue
        rel = path.relative_to(root).as_posix()
        shown = _not_utf8(rel)
        if shown is not None:
            result.skipped.append(SkippedFile(shown, NOT_UTF8_FOLDER))
        elif path.is_symlink():
            if not _inside(path, real_root):
                result.skipped.append(SkippedFile(rel, "symbolic link to a folder outside the image folder"))
        else:
            kept.append(name)
    return kept


def check_image_folder(folder: str | os.PathLike[str]) -> Path:
    """``folder`` (``~`` expanded) when it is a directory.

    Raises:
        MissingFileError: nothing there.
        ConfigError: a file, not a folder, or a path that is not valid UTF-8 (all name ``--images``).
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        if root.exists():
            raise ConfigError("--images", f"{root} is a file, not a folder of images")
        raise MissingFileError(f"--images: image folder not found: {root}")
    # The index records the folder's absolute path in its UTF-8 manifest: refused before anything is written.
    shown = _not_utf8(str(root.resolve()))
    if shown is not None:
        raise ConfigError("--images", f"the folder's path {shown} is not valid UTF-8: rename it")
    return root


def scan_images(
    folder: str | os.PathLike[str], *, exclude: os.PathLike[str] | str | None = None
) -> ScanResult:
    """Every image under ``folder``, recursively, recognised by content.

    Args:
        folder: the folder to scan.
        exclude: a folder below ``folder`` not to scan (the index being written, when it lives there).

    Returns:
        :class:`ScanResult` with the images sorted by relative path.

    Raises:
        MissingFileError, ConfigError: ``folder`` is not a directory (:func:`check_image_folder`).
    """
    root = check_image_folder(folder)
    real_root = root.resolve()
    excluded = Path(exclude).resolve() if exclude is not None else None
    result = ScanResult(root=root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = _subfolders(here, dirnames, root, real_root, excluded, result)
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = here / name
            rel = path.relative_to(root).as_posix()
            shown = _not_utf8(rel)
            if shown is not None:
                result.skipped.append(SkippedFile(shown, NOT_UTF8))
                continue
            looks_like_image = path.suffix.lower() in IMAGE_SUFFIXES
            if path.is_symlink() and not _inside(path, real_root):
                result.skipped.append(SkippedFile(rel, "symbolic link to a file outside the image folder"))
                continue
            try:
                if not path.is_file():
                    result.ignored += 1
                    continue
                fmt = _sniff(path)
                size, mtime_ns = file_signature(path)
            except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
                # UnidentifiedImageError is an OSError: Pillow does not know the content.
                if not looks_like_image:
                    result.ignored += 1
                elif isinstance(err, UnidentifiedImageError):
                    result.skipped.append(SkippedFile(rel, "not a readable image (unrecognised content)"))
                else:
                    result.skipped.append(SkippedFile(rel, f"cannot open: {err}"))
                continue
            result.images.append(ImageFile(rel, size, mtime_ns, fmt or "unknown"))
    result.images.sort(key=lambda f: f.path)
    logger.info(
        "%s: %d images, %d skipped, %d other files",
        root,
        len(result.images),
        len(result.skipped),
        result.ignored,
    )
    return result
