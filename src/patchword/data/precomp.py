"""Precomputed region features: the SCAN layout reader and a synthetic generator paired with the scenes.

**SCAN layout** (reference/naaf_scan_vse.md 4.1), one directory per dataset (``data/f30k_precomp``):

* ``{split}_ims.npy``: float32 (N_img, R, D) region features (BUTD: R = 36 boxes, D = 2048), read here as a
  read-only memory map, so an 8.5 GB training file costs no RAM until batches touch it (the official
  loaders ``np.load`` it whole);
* ``{split}_caps.txt``: one caption per line, the captions of image k on consecutive lines;
* ``{split}_ids.txt`` (optional): image ids, one per image or one per caption.

Captions map to images by SCAN's ``im_div`` rule generalised: with N_caps = c * N_img, caption k belongs
to image k // c (official: c = 5 if N_img != N_caps else 1; any other count silently misaligns there and
is an error here). COCO's ``testall`` (5000 images) is read like any split; ``eval.coco_1k=true`` reports
the five 1K folds.

**Synthetic region features.** :func:`synthetic_region_features` turns the structured scenes of
:mod:`patchword.data.synthetic` into detector-like features, so SCAN / NAAF / TGDT run and are tested here
without downloading BUTD features: every object yields ``boxes_per_object`` regions, each a fixed random
projection of the object's (shape, colour, size, cell) one-hots with random per-box attribute weights
(boxes of one object differ, like overlapping detections), the remaining regions are background
prototypes; Gaussian noise is added, negative values are clipped (pool5 features are ReLU outputs) and
the region order is shuffled (a detector sorts by confidence, not by position). Deterministic in
``(seed, split)``; the projection depends on the seed only, so all splits share one feature space.
"""

from __future__ import annotations

import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from patchword.data.captions import read_lines
from patchword.data.split import RetrievalSplit

__all__ = [
    "RegionFeatures",
    "RegionFeatureConfig",
    "load_precomp_split",
    "check_finite_rows",
    "write_precomp_split",
    "synthetic_region_features",
    "synthetic_region_split",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]

_SPLIT_IDS = {"train": 0, "dev": 1, "test": 2}
_CHUNK = 1024  # images generated at once


class RegionFeatures:
    """An ``ImageSource`` over a (N_img, R, D) array (in memory or memory-mapped).

    ``batch(indices, train)`` returns (B, R, D) float32 features of those images (no augmentation; the
    official region models use none).
    """

    def __init__(self, features: np.ndarray) -> None:
        if not isinstance(features, np.ndarray) or features.ndim != 3:
            shape = getattr(features, "shape", None)
            raise ValueError(f"region features must be a (N_img, R, D) array, got shape {shape}")
        if not np.issubdtype(features.dtype, np.floating):
            raise ValueError(f"region features must be floating point, got dtype {features.dtype}")
        self.features = features

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
        return torch.from_numpy(np.ascontiguousarray(self.features[idx], dtype=np.float32))


# ------------------------------------------------------------------------------------------ SCAN layout


def check_finite_rows(features: np.ndarray, path: PathLike, chunk: int = 1024) -> None:
    """Scan (N, ...) ``features`` in chunks of ``chunk`` rows (memory maps stay cheap) for NaN / inf.

    Raises:
        DataError: naming the file, the first bad row (image index) and how many rows are bad.
    """
    from patchword.errors import DataError

    bad_rows: list[int] = []
    for start in range(0, features.shape[0], chunk):
        block = np.asarray(features[start : start + chunk])
        finite = np.isfinite(block.reshape(block.shape[0], -1)).all(axis=1)
        bad_rows.extend((start + np.flatnonzero(~finite)).tolist())
    if bad_rows:
        raise DataError(
            f"{path}: row {bad_rows[0]} (image index) holds NaN or infinite values"
            + (f"; {len(bad_rows)} rows in all" if len(bad_rows) > 1 else "")
        )


def load_precomp_split(
    root: PathLike, split: str, *, mmap: bool = True, check_finite: bool = True
) -> RetrievalSplit:
    """Read one split of a SCAN-layout directory.

    Args:
        root: the directory holding ``{split}_ims.npy`` and ``{split}_caps.txt``.
        split: the split name as the files spell it (``train``, ``dev``, ``test``, ``testall``).
        mmap: memory-map the features (read-only) instead of loading them.
        check_finite: scan the features for NaN / inf (in chunks) and fail naming the first bad row.

    Returns:
        A :class:`RetrievalSplit` whose ``images`` is the (N_img, R, D) feature array; wrap it in
        :class:`RegionFeatures` to batch it.

    Raises:
        FileNotFoundError: a required file is missing.
        ValueError: features that are not a float (N, R, D) array, an empty caption, or a caption count
            that is not a multiple of the image count (named with both numbers).
    """
    root = Path(root)
    ims_path, caps_path = root / f"{split}_ims.npy", root / f"{split}_caps.txt"
    if not ims_path.is_file():
        raise FileNotFoundError(f"region features not found: {ims_path} (SCAN layout: {{split}}_ims.npy)")
    try:
        feats = np.load(ims_path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except ValueError as err:
        raise ValueError(f"{ims_path}: not a plain .npy array ({err})") from err
    if feats.ndim != 3 or feats.shape[0] == 0:
        raise ValueError(f"{ims_path}: expected a (N_img, R, D) array, got shape {feats.shape}")
    if not np.issubdtype(feats.dtype, np.floating):
        raise ValueError(f"{ims_path}: expected float features, got dtype {feats.dtype}")
    if feats.dtype != np.float32:
        logger.info("%s holds %s features; batches are converted to float32", ims_path, feats.dtype)
    if check_finite:
        check_finite_rows(feats, ims_path)
    captions = read_lines(caps_path, "caption")
    n_img, n_caps = feats.shape[0], len(captions)
    if n_caps % n_img:
        raise ValueError(
            f"{caps_path}: {n_caps} captions for {n_img} images in {ims_path.name}; the caption count must "
            "be a multiple of the image count (SCAN layout: the captions of image k on consecutive lines)"
        )
    per_image = n_caps // n_img
    txt2img = np.arange(n_caps, dtype=np.int64) // per_image
    image_ids = [str(i) for i in range(n_img)]
    ids_path = root / f"{split}_ids.txt"
    if ids_path.is_file():
        ids = read_lines(ids_path, "image id")
        if len(ids) == n_caps and per_image > 1:
            ids = ids[::per_image]  # one id per caption line (the im_div rule applied to ids, as VSE-inf)
        if len(ids) != n_img:
            raise ValueError(f"{ids_path}: {len(ids)} ids for {n_img} images / {n_caps} captions")
        image_ids = ids
    return RetrievalSplit(name=split, images=feats, captions=captions, txt2img=txt2img, image_ids=image_ids)


def write_precomp_split(
    root: PathLike, split: str, features: np.ndarray, captions: list[str], image_ids: list[str] | None = None
) -> None:
    """Write a split in the SCAN layout: ``{split}_ims.npy`` (float32), ``_caps.txt`` and ``_ids.txt``.

    ``captions`` must list the captions of image 0, then image 1, ... with the same count per image.
    """
    features = np.asarray(features, dtype=np.float32)
    if features.ndim != 3:
        raise ValueError(f"features must be (N_img, R, D), got shape {features.shape}")
    if len(captions) % features.shape[0]:
        raise ValueError(f"{len(captions)} captions for {features.shape[0]} images: not a multiple")
    if any("\n" in c or not c.strip() for c in captions):
        raise ValueError("captions must be non-empty single lines")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / f"{split}_ims.npy", features)
    (root / f"{split}_caps.txt").write_text("".join(c + "\n" for c in captions), encoding="utf-8")
    if image_ids is not None:
        (root / f"{split}_ids.txt").write_text("".join(f"{i}\n" for i in image_ids), encoding="utf-8")


# ------------------------------------------------------------------------------------------ synthetic


@dataclass(frozen=True)
class RegionFeatureConfig:
    """How synthetic region features are drawn from the scenes."""

    num_regions: int = 36  # regions per image, as BUTD's 36 boxes
    dim: int = 256  # feature width (BUTD: 2048; smaller keeps the demo fast)
    boxes_per_object: int = 3  # regions per object (overlapping detections)
    num_backgrounds: int = 8  # background prototypes the other regions are drawn from
    noise: float = 0.3  # norm of the Gaussian noise added to every region (signals have norm ~1-2)
    seed: int = 0  # seed of the projection and of the per-split draws


def _attribute_tables(cfg: RegionFeatureConfig, n_shapes: int, n_colours: int, n_sizes: int, n_cells: int):
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 0x5EED]))
    scale = 1.0 / np.sqrt(cfg.dim)  # each table row has norm ~1
    return {
        "shape": rng.normal(0, scale, (n_shapes, cfg.dim)),
        "colour": rng.normal(0, scale, (n_colours, cfg.dim)),
        "size": rng.normal(0, scale, (n_sizes, cfg.dim)),
        "cell": rng.normal(0, scale, (n_cells, cfg.dim)),
        "background": rng.normal(0, scale, (cfg.num_backgrounds, cfg.dim)),
    }


def synthetic_region_features(
    scenes,
    split: str,
    cfg: RegionFeatureConfig | None = None,
    *,
    num_shapes: int,
    num_colours: int,
    num_sizes: int = 2,
) -> np.ndarray:
    """Detector-like (N, R, D) float32 features of synthetic scenes (see the module docstring).

    Args:
        scenes: a :class:`~patchword.data.synthetic.SceneTable` ((N, 9) shape / colour / size codes).
        split: the split name (``train``, ``dev``, ``test``); it seeds the per-split draws.
        cfg: generation config.
        num_shapes, num_colours, num_sizes: vocabulary sizes of the scenes' attribute codes.
    """
    cfg = cfg or RegionFeatureConfig()
    n_cells = scenes.shape.shape[1]
    max_boxes = n_cells * cfg.boxes_per_object
    if cfg.num_regions < 1 or cfg.dim < 1 or cfg.boxes_per_object < 1 or cfg.num_backgrounds < 1:
        raise ValueError("num_regions, dim, boxes_per_object and num_backgrounds must be >= 1")
    most = int(scenes.count.max()) * cfg.boxes_per_object if len(scenes) else 0
    if most > cfg.num_regions:
        raise ValueError(
            f"num_regions={cfg.num_regions} cannot hold {most} object regions "
            f"({int(scenes.count.max())} objects x boxes_per_object={cfg.boxes_per_object})"
        )
    tables = _attribute_tables(cfg, num_shapes, num_colours, num_sizes, n_cells)
    # Known splits get fixed stream ids; any other name a stable hash (Python's hash() is salted per process).
    split_id = _SPLIT_IDS.get(split, zlib.crc32(split.encode()) + len(_SPLIT_IDS))
    n = len(scenes)
    out = np.empty((n, cfg.num_regions, cfg.dim), dtype=np.float32)
    cells = np.arange(n_cells)
    for start in range(0, n, _CHUNK):
        # One stream per fixed-size block of images keeps the temporaries bounded.
        rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, split_id, start // _CHUNK]))
        stop = min(n, start + _CHUNK)
        m = stop - start
        shape, colour, size = (
            np.asarray(a[start:stop], dtype=np.int64) for a in (scenes.shape, scenes.colour, scenes.size)
        )
        occupied = shape >= 0  # (m, 9)
        parts = np.stack(
            [
                tables["shape"][np.maximum(shape, 0)],
                tables["colour"][np.maximum(colour, 0)],
                tables["size"][np.maximum(size, 0)],
                np.broadcast_to(tables["cell"][cells], (m, n_cells, cfg.dim)),
            ],
            axis=2,
        )  # (m, 9, 4, D)
        # Each box of an object weighs the four attribute parts differently (a box covering the whole
        # object, one cropped to a part, one with context...), so its boxes are related, not identical.
        # Every draw is sized for a full block and sliced, so image i's values depend on i alone.
        weights = rng.uniform(0.6, 1.0, (_CHUNK, n_cells, cfg.boxes_per_object, 4))[:m]
        boxes = np.einsum("mcba,mcad->mcbd", weights, parts).reshape(m, max_boxes, cfg.dim)
        valid = np.repeat(occupied, cfg.boxes_per_object, axis=1)  # (m, 9 * boxes)
        # Background: a prototype at a random strength for every region, then object boxes on top.
        proto = rng.integers(0, cfg.num_backgrounds, (_CHUNK, cfg.num_regions))[:m]
        feats = tables["background"][proto] * rng.uniform(0.5, 1.0, (_CHUNK, cfg.num_regions, 1))[:m]
        # Valid boxes first (stable), then into random distinct region slots.
        order = np.argsort(~valid, axis=1, kind="stable")
        boxes = np.take_along_axis(boxes, order[..., None], axis=1)
        valid = np.take_along_axis(valid, order, axis=1)
        slots = np.argsort(rng.random((_CHUNK, cfg.num_regions))[:m], axis=1)
        k = min(max_boxes, cfg.num_regions)
        rows = np.arange(m)[:, None]
        target = slots[:, :k]
        feats[rows, target] = np.where(valid[:, :k, None], boxes[:, :k], feats[rows, target])
        feats += rng.normal(0, cfg.noise / np.sqrt(cfg.dim), (_CHUNK, *feats.shape[1:]))[:m]
        out[start:stop] = np.maximum(feats, 0)
    return out


def synthetic_region_split(
    split: RetrievalSplit,
    scenes,
    cfg: RegionFeatureConfig | None = None,
    *,
    num_shapes: int,
    num_colours: int,
) -> RetrievalSplit:
    """The synthetic ``split`` with its images replaced by region features (dense captions dropped)."""
    feats = synthetic_region_features(scenes, split.name, cfg, num_shapes=num_shapes, num_colours=num_colours)
    return RetrievalSplit(
        name=split.name,
        images=feats,
        captions=split.captions,
        txt2img=split.txt2img,
        image_ids=split.image_ids,
        dense_captions=None,
        fits=split.fits,
    )
