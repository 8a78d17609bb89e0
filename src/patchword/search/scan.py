"""Find the images under a folder by content, not by name.

A file is an image when Pillow recognises its header (``Image.open`` reads only the first bytes), so a
JPEG saved without an extension is found and a text file named ``x.jpg`` is not taken for one. What is
reported:

* images: sorted by relative POSIX path (the index order, deterministic across runs and machines);
* skipped: files that look like images (image extension) but cannot be opened, symbolic links leaving
  the folder, and unreadable files, each with its reason;
* ignored: how many other files (not images) were passed over.

Hidden files and folders (names starting with ``.``) are not scanned: they hold tool state (``.git``,
an index written inside the folder), not a user's pictures. Symbolic links are followed only when they
stay inside the folder, so an index never reaches files the folder's owner did not put there.
"""

from __future__ import annotations

import logging
import os
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

    ``size`` and ``mtime_ns`` are set for files that failed to decode: an update or a resumed build does
    not try such a file again until it changes.
    """

    path: str
    reason: str
    size: int | None = None
    mtime_ns: int | None = None


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
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def check_image_folder(folder: str | os.PathLike[str]) -> Path:
    """``folder`` (``~`` expanded) when it is a directory.

    Raises:
        MissingFileError: nothing there.
        ConfigError: a file, not a folder (both name ``--images``).
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        if root.exists():
            raise ConfigError("--images", f"{root} is a file, not a folder of images")
        raise MissingFileError(f"--images: image folder not found: {root}")
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
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".") and (excluded is None or (here / d).resolve() != excluded)
        )
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = here / name
            rel = path.relative_to(root).as_posix()
            looks_like_image = path.suffix.lower() in IMAGE_SUFFIXES
            if path.is_symlink() and not _inside(path.resolve(), real_root):
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
