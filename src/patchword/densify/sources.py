"""The ordered image lists densify describes: a folder, a LAPS/SEPS or Karpathy split, the synthetic scenes.

The order of a list is the order of the output file. Each image has an id written to the output's
metadata, by which a rerun recognises finished work:

* a folder: every image file below it, sorted by relative path (POSIX separators); the id is that path;
* a LAPS/SEPS split: the split's image order (first appearance in ``{split}_ids.txt``); the id is the
  dataset id, so the file lines up with ``data.dense_<split>`` of the ``laps`` loader;
* a Karpathy split: the split's image order in ``dataset_*.json`` as the ``karpathy`` loader reads it; the
  id is the loader's (``cocoid``, else ``imgid``, else the file), so the file lines up with
  ``data.dense_<split>`` of the ``karpathy`` loader;
* the synthetic scenes: ``syn-<split>-<index>`` ids, the ids of the synthetic splits, which lets
  ``densify stats`` compare each description with the scene it describes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from patchword.data.images import load_image
from patchword.errors import ConfigError, DataError, MissingFileError

__all__ = [
    "IMAGE_SUFFIXES",
    "ImageItem",
    "ImageList",
    "ArrayImageList",
    "SOURCE_OPTIONS",
    "check_source_options",
    "images_from_folder",
    "images_from_laps",
    "images_from_karpathy",
    "images_from_synthetic",
    "fingerprint",
]

#: File suffixes (lower case) a folder scan treats as images.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")

#: The options each image source of ``patchword densify`` reads, by the source's flag: given with another
#: source, one would be ignored (``--images DIR --split test`` described every image below DIR).
SOURCE_OPTIONS = {
    "--images": (),
    "--data-root": ("--split", "--image-root"),
    "--karpathy": ("--split", "--image-root"),
    "--synthetic": ("--synthetic-seed", "--synthetic-num-images", "--synthetic-image-size"),
}


def check_source_options(arguments: Mapping[str, object]) -> None:
    """The image-source options among ``arguments`` (``patchword densify``'s parsed arguments by name,
    ``synthetic_seed``; an option not given is absent or None) are those of the source given.

    Raises:
        ConfigError: naming the first option only other sources read, the sources that read it and the
            source given.
    """
    given = [f"--{name.replace('_', '-')}" for name, value in arguments.items() if value is not None]
    source = next((flag for flag in given if flag in SOURCE_OPTIONS), None)
    for flag in given if source is not None else ():
        owners = [name for name, options in SOURCE_OPTIONS.items() if flag in options]
        if owners and source not in owners:
            readers = " or ".join(owners)
            raise ConfigError(flag, f"is read only with {readers}; {source} does not read it: drop it")


@dataclass(frozen=True)
class ImageItem:
    """One image of a list.

    Attributes:
        image_id: the id written to the output metadata (unique within the list).
        file: the file name shown in metadata and errors (relative to the list's root).
        path: where the pixels are; None for in-memory images.
    """

    image_id: str
    file: str
    path: Path | None = None


def fingerprint(image_ids: Sequence[str]) -> str:
    """sha256 of the ids in order: two lists with the same fingerprint are the same list."""
    digest = hashlib.sha256()
    for image_id in image_ids:
        digest.update(image_id.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


class ImageList:
    """An ordered list of images read from files.

    Args:
        items: the images, in output order.
        source: a JSON-ready description of where the list comes from (recorded next to the output).
        exif_orientation: turn each image upright as its EXIF orientation tag says
            (:func:`~patchword.data.images.load_image`): a folder's images are described as ``index build``
            indexes them and a browser shows them; a dataset split's as its loader reads them by default
            (as stored, ``data.exif_orientation=false``).
    """

    def __init__(
        self, items: Sequence[ImageItem], source: dict[str, object], *, exif_orientation: bool = False
    ) -> None:
        self.items = list(items)
        self.source = source
        self.exif_orientation = exif_orientation
        seen: set[str] = set()
        for item in self.items:
            if item.image_id in seen:
                raise DataError(f"image id {item.image_id!r} appears twice in {source}")
            seen.add(item.image_id)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def image_ids(self) -> list[str]:
        return [item.image_id for item in self.items]

    def missing_files(self) -> list[ImageItem]:
        """The items whose file does not exist."""
        return [item for item in self.items if item.path is not None and not item.path.is_file()]

    def load(self, index: int) -> Image.Image:
        """Decode image ``index`` as RGB.

        Raises:
            MissingFileError: the file does not exist.
            DataError: the file is not a readable image (names the file and the image id).
        """
        item = self.items[index]
        try:
            return load_image(item.path, exif_orientation=self.exif_orientation)
        except FileNotFoundError as err:
            raise MissingFileError(f"image {item.image_id!r}: file not found: {item.path}") from err
        except ValueError as err:
            raise DataError(f"image {item.image_id!r}: {err}") from err


class ArrayImageList(ImageList):
    """Images held in memory as an (N, H, W, 3) uint8 array (the synthetic scenes)."""

    def __init__(self, items: Sequence[ImageItem], source: dict[str, object], pixels: np.ndarray) -> None:
        super().__init__(items, source)
        if len(pixels) != len(self.items):
            raise ValueError(f"{len(pixels)} images for {len(self.items)} ids")
        self.pixels = pixels

    def load(self, index: int) -> Image.Image:
        return Image.fromarray(self.pixels[index])


def images_from_folder(folder: str | os.PathLike[str]) -> ImageList:
    """Every image file below ``folder`` (hidden files and folders skipped), sorted by relative path.

    Raises:
        MissingFileError: the folder does not exist.
        ConfigError: ``folder`` is a file.
        DataError: it holds no image file.
    """
    root = Path(folder).expanduser()
    if root.exists() and not root.is_dir():
        raise ConfigError("--images", f"{root} is a file, not a folder: --images names the folder of images")
    if not root.is_dir():
        raise MissingFileError(f"--images: image folder not found: {root}")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if not name.startswith(".") and Path(name).suffix.lower() in IMAGE_SUFFIXES:
                found.append(_utf8_name(root, Path(dirpath, name).relative_to(root).as_posix()))
    if not found:
        raise DataError(f"--images: no image files ({', '.join(IMAGE_SUFFIXES)}) under {root}")
    items = [ImageItem(rel, rel, root / rel) for rel in sorted(found)]
    # upright, as index build reads the folder: the dense captions describe the pictures it indexes
    return ImageList(items, {"kind": "folder", "root": str(root.resolve())}, exif_orientation=True)


def _utf8_name(root: Path, rel: str) -> str:
    """``rel`` if it is valid UTF-8: the id goes into the UTF-8 output and its fingerprint.

    Raises:
        DataError: a file (or folder) name that is not UTF-8 (Python decodes its bytes to surrogates).
    """
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        raise DataError(
            f"--images: {root}: the file name {rel!r} is not valid UTF-8: rename it (or move it out of the "
            "folder); image ids are written as UTF-8 text"
        ) from None
    return rel


def _file_name(path: Path, image_root: Path) -> str:
    """The name of ``path`` shown in metadata: relative to ``image_root``, or as the mapping gave it (an
    absolute path elsewhere, which the laps loader accepts too)."""
    try:
        return path.relative_to(image_root).as_posix()
    except ValueError:
        return path.as_posix()


def images_from_laps(
    data_root: str | os.PathLike[str], split: str, image_root: str | os.PathLike[str] | None = None
) -> ImageList:
    """The images of a LAPS/SEPS split, in the split's image order, identified by dataset id.

    Args:
        data_root: folder with ``{split}_ids.txt``, ``{split}_caps.txt`` and ``id_mapping.json``.
        split: ``train``, ``dev``, ``test``, ``testall``...
        image_root: folder the mapped file names are relative to (default: ``data_root``).
    """
    from patchword.data.laps import load_laps_split

    image_root = Path(data_root if image_root is None else image_root).expanduser()
    # densify reads only the images: no caption count is checked (densify has no data.* settings)
    laps = load_laps_split(data_root, split, image_root, check_images=False, captions_per_image=None)
    items = [
        ImageItem(str(image_id), _file_name(Path(path), image_root), Path(path))
        for image_id, path in zip(laps.image_ids, laps.images, strict=True)
    ]
    source = {
        "kind": "laps",
        "data_root": str(Path(data_root).resolve()),
        "split": split,
        "image_root": str(image_root.resolve()),
    }
    return ImageList(items, source)


def images_from_karpathy(
    path: str | os.PathLike[str], split: str, image_root: str | os.PathLike[str]
) -> ImageList:
    """The images of a split of a Karpathy ``dataset_*.json``, in the order the ``karpathy`` loader reads
    them (:func:`~patchword.data.karpathy.load_karpathy_json`, as ``data.dataset=karpathy`` calls it:
    ``train`` takes the ``restval`` images too, ``dev`` is ``val``), identified by the loader's image ids.

    Args:
        path: the json file.
        split: ``train``, ``val`` (or ``dev``), ``test`` or ``restval``.
        image_root: folder the json's ``filepath/filename`` are relative to (``data.image_root``).

    Raises:
        MissingFileError: the json does not exist.
        ConfigError: ``path`` is a folder.
        ValueError, DataError: the loader's (an unknown split, a malformed json), naming the json.
    """
    from patchword.data.karpathy import load_karpathy_json

    path, image_root = Path(path).expanduser(), Path(image_root).expanduser()
    if path.is_dir():
        raise ConfigError("--karpathy", f"{path} is a folder: --karpathy names the dataset_*.json file")
    if not path.is_file():
        raise MissingFileError(f"--karpathy: Karpathy dataset json not found: {path}")
    # densify reads only the images; a missing file is the runner's to report (before the model loads)
    karpathy = load_karpathy_json(path, split, image_root, check_images=False)
    items = [
        ImageItem(str(image_id), _file_name(Path(image), image_root), Path(image))
        for image_id, image in zip(karpathy.image_ids, karpathy.images, strict=True)
    ]
    source = {
        "kind": "karpathy",
        "json": str(path.resolve()),
        "split": split,
        "image_root": str(image_root.resolve()),
    }
    return ImageList(items, source)


def images_from_synthetic(split: str, config: object | None = None) -> ArrayImageList:
    """The rendered images of a synthetic split (:mod:`patchword.data.synthetic`), ids ``syn-<split>-<i>``.

    Args:
        split: ``train``, ``dev`` or ``test``.
        config: a :class:`~patchword.data.synthetic.SyntheticConfig` (default: the default config).
    """
    from patchword.data.synthetic import SPLITS, SyntheticConfig, generate_split

    if split not in SPLITS:
        raise DataError(f"--synthetic: unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    config = config or SyntheticConfig()
    scenes = generate_split(config, split)
    items = [ImageItem(image_id, image_id) for image_id in scenes.image_ids]
    source = {"kind": "synthetic", "split": split, "config": dataclasses.asdict(config)}
    return ArrayImageList(items, source, scenes.images)
