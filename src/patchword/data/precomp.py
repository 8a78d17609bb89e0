"""Precomputed region features in the SCAN layout (``data/{dataset}_precomp``).

**SCAN layout** (reference/naaf_scan_vse.md 4.1), one directory per dataset (``data/f30k_precomp``):

* ``{split}_ims.npy``: float32 (N_img, R, D) region features (BUTD: R = 36 boxes, D = 2048), read here as a
  read-only memory map, so an 8.5 GB training file costs no RAM until batches touch it (the official
  loaders ``np.load`` it whole);
* ``{split}_caps.txt``: one caption per line, the captions of image k on consecutive lines;
* ``{split}_ids.txt`` (optional): image ids, one per image (each a distinct image, checked) or one per
  caption (then each image's captions repeat its id on consecutive lines, checked);
* ``{split}_boxes.npy`` (with ``data.region_boxes=true``): float (N_img, R, 4) boxes ``[x1, y1, x2, y2]``
  normalised by the image width and height (TERAN / TGDT's ``bu_box`` divided by the image size), appended
  to each region's feature as four trailing channels for a region encoder that encodes boxes.

Captions map to images by SCAN's ``im_div`` rule generalised: with N_caps = c * N_img, caption k belongs
to image k // c (official: c = 5 if N_img != N_caps else 1; any other count silently misaligns there and
is an error here). Unless ids (or feature rows) repeated per caption confirm the grouping, c must be
exactly ``data.captions_per_image`` (5): more means features of part of the images, fewer a captions file
cut short, either shifting every caption; as many distinct rows as captions is one caption per image only
with ``data.captions_per_image=1``. With one feature row per caption (N_img = N_caps, SCAN's layout of
repeated image features, whose ``evalrank`` keeps every 5th row) each image's rows, recognised by ids
repeated in runs or by rows that are copies in runs, are read as one row (logged); not with
``data.captions_per_image=1``, where every row is its own image. COCO's ``testall``
(5000 images) is read like any split; ``eval.coco_1k=true`` reports the five 1K folds.

Synthetic region features for the embedded scenes live in :mod:`patchword.data.synthetic.regions`.

Over 400 lines: the reader, the writer of the same layout and the checks that keep each caption on its
image (ids per caption, repeated rows, caption counts) belong together; they share the file names.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from patchword.data.npy import load_npy
from patchword.data.split import RetrievalSplit
from patchword.data.textfiles import captions_per_image_mismatch, first_repeat, line_origin, read_lines
from patchword.fileio import atomic_write, atomic_write_text, staging_dir, staging_dirs

__all__ = [
    "RegionFeatures",
    "load_precomp_split",
    "load_region_boxes",
    "check_finite_rows",
    "write_precomp_split",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]


class RegionFeatures:
    """An ``ImageSource`` over a (N_img, R, D) array (in memory or memory-mapped), optionally with boxes.

    ``batch(indices, train)`` returns (B, R, D) float32 features of those images, or (B, R, D + 4) with each
    region's box last when ``boxes`` (N_img, R, 4) are given (no augmentation; the official region models
    use none).
    """

    def __init__(self, features: np.ndarray, boxes: np.ndarray | None = None) -> None:
        if not isinstance(features, np.ndarray) or features.ndim != 3:
            shape = getattr(features, "shape", None)
            raise ValueError(f"region features must be a (N_img, R, D) array, got shape {shape}")
        if not np.issubdtype(features.dtype, np.floating):
            raise ValueError(f"region features must be floating point, got dtype {features.dtype}")
        if boxes is not None and boxes.shape != (*features.shape[:2], 4):
            raise ValueError(f"boxes must be (N_img, R, 4) = {(*features.shape[:2], 4)}, got {boxes.shape}")
        self.features, self.boxes = features, boxes

    def __len__(self) -> int:
        return self.features.shape[0]

    @property
    def num_regions(self) -> int:
        return self.features.shape[1]

    @property
    def dim(self) -> int:
        return self.features.shape[2]

    def batch(self, indices: torch.Tensor, train: bool) -> torch.Tensor:
        idx = np.asarray(indices.cpu() if isinstance(indices, torch.Tensor) else indices, dtype=np.int64)
        # Fancy indexing reads exactly these rows (from disk for a memory map) into a new array.
        rows = np.ascontiguousarray(self.features[idx], dtype=np.float32)
        if self.boxes is not None:
            rows = np.concatenate([rows, np.asarray(self.boxes[idx], dtype=np.float32)], axis=2)
        return torch.from_numpy(rows)


# ------------------------------------------------------------------------------------------ SCAN layout


def check_finite_rows(features: np.ndarray, path: PathLike, chunk: int = 1024) -> None:
    """Scan (N, ...) ``features`` in chunks of ``chunk`` rows (memory maps stay cheap) for NaN / inf, as
    the float32 the batches are cast to: a float64 value beyond float32's range (about 3.4e38) is finite in
    the file and infinite in the model.

    Raises:
        DataError: naming the file, the first bad row (image index) and how many rows are bad.
    """
    from patchword.errors import DataError

    bad_rows: list[int] = []
    for start in range(0, features.shape[0], chunk):
        block = np.asarray(features[start : start + chunk])
        if block.dtype != np.float32:
            with np.errstate(over="ignore", invalid="ignore"):  # the overflow is what is reported
                block = block.astype(np.float32)
        finite = np.isfinite(block.reshape(block.shape[0], -1)).all(axis=1)
        bad_rows.extend((start + np.flatnonzero(~finite)).tolist())
    if bad_rows:
        raise DataError(
            f"{path}: row {bad_rows[0]} (image index) holds NaN or infinite values"
            + (f"; {len(bad_rows)} rows in all" if len(bad_rows) > 1 else "")
        )


def _ids_per_caption_to_images(ids: list[str], per_image: int, ids_path: Path) -> list[str]:
    """One id per image from an ids file with one line per caption (the im_div rule applied to ids, as
    VSE-inf does).

    Each image's ``per_image`` lines must repeat one id that no other image has; anything else means the
    ids file groups the captions differently from the features and the captions, so it is refused rather
    than sliced (``ids[::per_image]`` would label images with the wrong ids).

    Raises:
        DataError: naming the ids file and the first line that breaks the runs.
    """
    from patchword.errors import DataError

    image_ids: list[str] = []
    first_line: dict[str, int] = {}
    for start in range(0, len(ids), per_image):
        image_id = ids[start]
        for offset, other in enumerate(ids[start : start + per_image]):
            if other != image_id:
                raise DataError(
                    f"{ids_path}:{start + offset + 1}: id {other!r} breaks the run of {image_id!r} from line "
                    f"{start + 1}; with one id per caption each image's {per_image} lines repeat one id"
                )
        if image_id in first_line:
            raise DataError(
                f"{ids_path}:{start + 1}: id {image_id!r} starts a second run of {per_image} lines (the "
                f"first starts at line {first_line[image_id]}); each image's {per_image} lines must repeat "
                "its own id"
            )
        first_line[image_id] = start + 1
        image_ids.append(image_id)
    return image_ids


def load_precomp_split(
    root: PathLike, split: str, *, mmap: bool = True, check_finite: bool = True, captions_per_image: int = 5
) -> RetrievalSplit:
    """Read one split of a SCAN-layout directory.

    Args:
        root: the directory holding ``{split}_ims.npy`` and ``{split}_caps.txt``.
        split: the split name as the files spell it (``train``, ``dev``, ``test``, ``testall``).
        mmap: memory-map the features (read-only) instead of loading them.
        check_finite: scan the features for NaN / inf (in chunks) and fail naming the first bad row.
        captions_per_image: the captions of each image (``data.captions_per_image``; SCAN: 5). Without
            ids or rows that repeat per caption, more or fewer captions per feature row are refused: the
            features would cover only part of the images, or the captions file was cut short.

    Returns:
        A :class:`RetrievalSplit` whose ``images`` is the (N_img, R, D) feature array; wrap it in
        :class:`RegionFeatures` to batch it.

    Raises:
        FileNotFoundError: a required file is missing.
        DataError: a features file that is not a .npy array (text, a pickle) or is truncated; an empty
            captions file; other than ``captions_per_image`` captions per image (without ids or rows
            repeated per caption); an ids file with neither one id per image nor one per caption; a
            repeated image id; one row per caption whose runs are not copies.
        ValueError: features that are not a float (N, R, D) array, an empty caption, or a caption count
            that is not a multiple of the image count (named with both numbers).
    """
    from patchword.errors import DataError

    root = Path(root)
    ims_path, caps_path = root / f"{split}_ims.npy", root / f"{split}_caps.txt"
    if not ims_path.is_file():
        raise FileNotFoundError(f"region features not found: {ims_path} (SCAN layout: {{split}}_ims.npy)")
    feats = load_npy(
        ims_path, mmap=mmap, fix="the SCAN layout needs a float (N_img, R, D) array written by numpy.save"
    )
    if feats.ndim != 3 or feats.shape[0] == 0:
        raise ValueError(f"{ims_path}: expected a (N_img, R, D) array, got shape {feats.shape}")
    if not np.issubdtype(feats.dtype, np.floating):
        raise ValueError(f"{ims_path}: expected float features, got dtype {feats.dtype}")
    if feats.dtype != np.float32:
        logger.info("%s holds %s features; batches are converted to float32", ims_path, feats.dtype)
    if check_finite:
        check_finite_rows(feats, ims_path)
    if not caps_path.is_file() and _stages(root, split):
        raise FileNotFoundError(
            f"captions not found: {caps_path}: a write_precomp_split of split {split!r} was stopped while it "
            f"replaced the files ({_stages(root, split)[0].name} is what it left); write the split again"
        )
    captions = read_lines(caps_path, "caption")
    if not captions:
        raise DataError(f"{caps_path}: empty: no captions")
    n_img, n_caps = feats.shape[0], len(captions)
    if n_caps % n_img:
        raise ValueError(
            f"{caps_path}: {n_caps} captions for {n_img} images in {ims_path.name}; the caption count must "
            "be a multiple of the image count (SCAN layout: the captions of image k on consecutive lines)"
        )
    ids_path = root / f"{split}_ids.txt"
    ids = read_lines(ids_path, "image id") if ids_path.is_file() else None
    if n_caps == n_img > 1 and captions_per_image != 1:
        # with one caption per image every row is its own image: two equal rows (zero placeholders) are
        # no run of copies, and repeated ids are refused below, not read as runs
        feats, ids = _one_row_per_image(feats, ids, ims_path, ids_path)
    # runs of copied rows, or of repeated ids, confirm the grouping whatever its count
    grouped = feats.shape[0] < n_img
    n_img = feats.shape[0]
    per_image = n_caps // n_img
    if ids is not None and len(ids) not in (n_img, n_caps):
        # an ids file of another split or cut short: no caption count would mend it
        raise DataError(
            f"{ids_path}: {len(ids)} ids for {n_img} images in {ims_path.name} and {n_caps} captions; "
            "expected one id per image or one per caption"
        )
    if ids is not None and len(ids) == n_caps and per_image > 1:
        ids = _ids_per_caption_to_images(ids, per_image, ids_path)
    elif per_image != captions_per_image and not grouped:
        # features (or ids) of part of the images, or a captions file cut short: every caption would move
        listed = f" and {ids_path.name} lists {len(ids)} ids" if ids is not None else ""
        raise DataError(
            f"{caps_path}: {n_caps} captions for {n_img} images in {ims_path.name}{listed}: "
            + captions_per_image_mismatch(per_image, captions_per_image, "a features file")
        )
    image_ids = [str(i) for i in range(n_img)]
    if ids is not None:
        if len(ids) != n_img:
            raise ValueError(f"{ids_path}: {len(ids)} ids for {n_img} images / {n_caps} captions")
        _refuse_repeated_ids(ids, ids_path, n_caps)
        image_ids = ids
    txt2img = np.arange(n_caps, dtype=np.int64) // per_image
    return RetrievalSplit(
        name=split,
        images=feats,
        captions=captions,
        txt2img=txt2img,
        image_ids=image_ids,
        caption_origin=line_origin(caps_path, n_caps),
    )


def _refuse_repeated_ids(ids: list[str], ids_path: Path, n_caps: int) -> None:
    """One id per image: a repeated id is one image under two indices (tied in every ranking).

    Raises:
        DataError: naming the ids file and both lines.
    """
    from patchword.errors import DataError

    repeat = first_repeat(ids)
    if repeat is not None:
        i, j = repeat
        raise DataError(
            f"{ids_path}:{j + 1}: image id {ids[j]!r} repeats line {i + 1}; with one id per image "
            f"({len(ids)} ids, one per feature row, for {n_caps} captions) each line is a distinct image"
        )


def _one_row_per_image(
    feats: np.ndarray, ids: list[str] | None, ims_path: Path, ids_path: Path
) -> tuple[np.ndarray, list[str] | None]:
    """Features with one row per caption (SCAN's layout: each image's row repeated for each of its
    captions, as the official loaders read it with ``im_div = 1`` and ``evalrank`` keeps every 5th row)
    as one row per image, with one id per image.

    The runs come from the ids (each image's lines repeat its id) or, without an ids file or with one id
    per image (fewer ids than rows, returned as they are), from the rows (each image's rows are copies).
    The result is a strided view of ``feats`` (a memory map stays one). Rows that are all distinct images
    come back as they are.

    Raises:
        DataError: ids that repeat but not in runs of one length (one id per image with a repeated id),
            or rows of one run that are not copies of each other.
    """
    n = feats.shape[0]
    if ids is not None and len(ids) == n:  # one id per row: the ids give the runs
        per_image = _run_length(ids)
        if per_image is None:
            _refuse_uneven_runs(ids, ids_path)  # mostly runs of several lines: one id per caption, broken
        if per_image in (None, 1):
            # one id per image (repeats refused by the caller), or a few repeated ids among single lines:
            # the caller refuses the repeated id, naming the lines
            return feats, ids
        image_ids = _ids_per_caption_to_images(ids, per_image, ids_path)
        source = f"{ids_path.name} repeats each id on {per_image} lines"
    else:  # no ids, or one id per image (fewer than the rows): the copied rows give the runs
        per_image = 1
        while per_image < n and np.array_equal(feats[per_image], feats[0]):
            per_image += 1
        if per_image == 1:
            return feats, ids
        image_ids = ids  # None, or one per image: the caller checks their count against the images
        source = f"its rows come in runs of {per_image} copies"
    _check_runs_are_copies(feats, per_image, ims_path)
    logger.info(
        "%s holds one row per caption (%s): read as %d images, one row each, as SCAN's evaluation does",
        ims_path,
        source,
        n // per_image,
    )
    return feats[::per_image], image_ids


def _runs(ids: list[str]) -> tuple[list[int], list[int]]:
    """Where each run of equal consecutive ids starts, and its length (one scan)."""
    starts = [k for k in range(len(ids)) if k == 0 or ids[k] != ids[k - 1]]
    return starts, [b - a for a, b in zip(starts, [*starts[1:], len(ids)], strict=True)]


def _run_length(ids: list[str]) -> int | None:
    """The length every run of equal consecutive ids has (1: no id repeats its neighbour), or None when the
    runs differ in length."""
    lengths = set(_runs(ids)[1])
    return lengths.pop() if len(lengths) == 1 else None


def _refuse_uneven_runs(ids: list[str], ids_path: Path) -> None:
    """Ids with one line per caption whose runs of equal consecutive ids differ in length (a line left
    out or added shifts every caption after it) are refused naming the first run of another length than
    most runs'; ids that mostly do not repeat their neighbour (one id per image, one of them repeated)
    are left to the caller.

    Raises:
        DataError: naming the ids file, the line where the run breaks, its id and where it started.
    """
    from patchword.errors import DataError

    starts, lengths = _runs(ids)
    usual = Counter(lengths).most_common(1)[0][0]  # ties: the first run's (one count, not one per run)
    if usual == 1:
        return
    start, length = next((a, n) for a, n in zip(starts, lengths, strict=True) if n != usual)
    run = f"the run of id {ids[start]!r} from line {start + 1}"
    lines = f"{length} line{'s' if length > 1 else ''}"
    if length > usual:
        broken = f"{start + usual + 1}: {run} goes on past {usual} lines ({lines})"
    elif start + length < len(ids):
        broken = f"{start + length + 1}: id {ids[start + length]!r} ends {run} after {lines}"
    else:
        broken = f"{len(ids)}: the file ends {lines} into {run}"
    raise DataError(
        f"{ids_path}:{broken}, where most runs have {usual}: with one id per caption (and one feature row "
        "per caption) each image's lines repeat its id, so a line left out or added there moves every "
        "caption after it onto another image; mend the ids file"
    )


def _check_runs_are_copies(feats: np.ndarray, per_image: int, ims_path: Path, chunk: int = 1024) -> None:
    """Every run of ``per_image`` rows holds one image's features repeated (read in chunks of images).

    Raises:
        DataError: naming the features file and the first row that differs from its run's first row.
    """
    from patchword.errors import DataError

    n = feats.shape[0]
    if n % per_image:
        raise DataError(
            f"{ims_path}: rows 0..{per_image - 1} are copies of one image, but the {n} rows do not split "
            f"into runs of {per_image}: the same features twice, or one row per caption with a partial run"
        )
    step = chunk * per_image
    for start in range(0, n, step):
        block = np.asarray(feats[start : start + step])
        runs = block.reshape(-1, per_image, *block.shape[1:])
        same = (runs == runs[:, :1]).reshape(runs.shape[0], per_image, -1).all(axis=2)
        if not same.all():
            run, offset = np.argwhere(~same)[0]
            first = start + int(run) * per_image
            raise DataError(
                f"{ims_path}: row {first + int(offset)} differs from row {first}, the first of its run of "
                f"{per_image} rows; with one row per caption each image's rows must be copies (or give one "
                "row per image)"
            )


def load_region_boxes(root: PathLike, split: str, shape: tuple[int, ...]) -> np.ndarray:
    """``{split}_boxes.npy`` of a SCAN-layout directory: (N_img, R, 4) normalised boxes, in memory.

    Args:
        shape: the split's feature array shape (N_img, R, D): the boxes must give every region one box.

    Raises:
        FileNotFoundError: no boxes file; DataError: not a float (N_img, R, 4) array, non-finite values, or
            coordinates outside [0, 1] (boxes in pixels: divide them by the image width and height).
    """
    from patchword.errors import DataError

    path = Path(root) / f"{split}_boxes.npy"
    if not path.is_file():
        raise FileNotFoundError(
            f"region boxes not found: {path} "
            "(data.region_boxes=true reads {split}_boxes.npy, (N_img, R, 4))"
        )
    boxes = load_npy(path, mmap=False, fix="write the boxes with numpy.save as a float (N_img, R, 4) array")
    want = (*shape[:2], 4)
    runs = boxes.shape[0] // shape[0] if boxes.ndim == 3 and boxes.shape[1:] == want[1:] else 1
    if (
        runs > 1
        and boxes.shape[0] == runs * shape[0]
        and np.array_equal(np.repeat(boxes[::runs], runs, 0), boxes)
    ):
        boxes = boxes[::runs]  # one row per caption, read as one row per image like the features
    if boxes.shape != want or not np.issubdtype(boxes.dtype, np.floating):
        raise DataError(f"{path}: expected float boxes of shape {want}, got {boxes.dtype} {boxes.shape}")
    check_finite_rows(boxes, path)
    if boxes.min() < 0 or boxes.max() > 1:
        raise DataError(
            f"{path}: box coordinates range over [{boxes.min():g}, {boxes.max():g}]; they must be normalised "
            "to [0, 1] by the image width and height ([x1, y1, x2, y2] / [w, h, w, h])"
        )
    return boxes.astype(np.float32, copy=False)


def write_precomp_split(
    root: PathLike,
    split: str,
    features: np.ndarray,
    captions: list[str],
    image_ids: list[str] | None = None,
    boxes: np.ndarray | None = None,
) -> None:
    """Write a split in the SCAN layout: ``{split}_ims.npy`` (float32), ``_caps.txt``, ``_ids.txt`` and
    (given ``boxes``, (N_img, R, 4) normalised) ``_boxes.npy``.

    ``captions`` must list the captions of image 0, then image 1, ... with the same count per image.

    The files are one set: every file is written in full (flushed to disk) in a staging folder beside them
    before any old file changes, so an error (a full disk) leaves the split as it was. The old captions go
    first and the new ones come last, so a kill while the files are moved in leaves a split without
    captions, which :func:`load_precomp_split` refuses, never new features beside old captions. An old
    ``_ids.txt`` or ``_boxes.npy`` this call does not replace is removed: it describes other images.
    """
    features = np.asarray(features, dtype=np.float32)
    if features.ndim != 3:
        raise ValueError(f"features must be (N_img, R, D), got shape {features.shape}")
    if len(captions) % features.shape[0]:
        raise ValueError(f"{len(captions)} captions for {features.shape[0]} images: not a multiple")
    if any("\n" in c or not c.strip() for c in captions):
        raise ValueError("captions must be non-empty single lines")
    if boxes is not None:
        boxes = np.asarray(boxes, dtype=np.float32)
        if boxes.shape != (*features.shape[:2], 4):
            raise ValueError(f"boxes must be (N_img, R, 4) = {(*features.shape[:2], 4)}, got {boxes.shape}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_stages(root, split)
    names = {key: f"{split}_{key}" for key in ("ims.npy", "caps.txt", "ids.txt", "boxes.npy")}
    arrays = {"ims.npy": features, "boxes.npy": boxes}
    texts = {
        "caps.txt": "".join(c + "\n" for c in captions),
        "ids.txt": None if image_ids is None else "".join(f"{i}\n" for i in image_ids),
    }
    stage = Path(staging_dir(root / split, _STAGE_LABEL))
    try:
        for key, array in arrays.items():
            if array is not None:
                atomic_write(stage / names[key], lambda fh, a=array: np.save(fh, a, allow_pickle=False))
        for key, text in texts.items():
            if text is not None:
                atomic_write_text(stage / names[key], text)
        # the set is complete on disk: move it in, the captions last (see the docstring)
        (root / names["caps.txt"]).unlink(missing_ok=True)
        for key in ("ims.npy", "ids.txt", "boxes.npy", "caps.txt"):
            if (stage / names[key]).exists():
                os.replace(stage / names[key], root / names[key])
            else:
                (root / names[key]).unlink(missing_ok=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


_STAGE_LABEL = "precomp"


def _stages(root: Path, split: str) -> list[Path]:
    """The staging folders of writes of ``split`` in ``root``; outside a write, those a killed write left."""
    return [Path(path) for path in staging_dirs(root / split, _STAGE_LABEL)]


def _remove_stale_stages(root: Path, split: str) -> None:
    """Remove what killed writes of ``split`` left (each staging folder as large as the features)."""
    for path in _stages(root, split):
        shutil.rmtree(path, ignore_errors=True)
