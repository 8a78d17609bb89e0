"""Synthetic region features: the scenes as detector-like features, so SCAN / NAAF / TGDT run and are tested
without downloading BUTD features.

:func:`synthetic_region_features`: every object of a scene yields ``boxes_per_object`` regions, each a
fixed random projection of the object's (shape, colour, size, cell) one-hots with random per-box
attribute weights (boxes of one object differ, like overlapping detections), the remaining regions are
background prototypes; Gaussian noise is added, negative values are clipped (pool5 features are ReLU
outputs) and the region order is shuffled (a detector sorts by confidence, not by position).
Deterministic in ``(seed, split)``; the projection depends on the seed only, so all splits share one
feature space.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from patchword.data.split import RetrievalSplit

__all__ = ["RegionFeatureConfig", "synthetic_region_features", "synthetic_region_split"]

_SPLIT_IDS = {"train": 0, "dev": 1, "test": 2}
_CHUNK = 1024  # images generated at once


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
