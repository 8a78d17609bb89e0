"""Synthetic scenes: the embedded default dataset (no download, CPU-fast, exact ground truth).

Each image is a 3x3 grid holding 1-4 non-overlapping objects (shape, colour, size) on a plain light grey
background. Every image gets five short *sparse* captions and one exhaustive, deliberately noisy *dense*
(MLLM-style) description. The generator keeps a structured record of every scene and every caption, so it
knows exactly which images each caption fits. That relation powers two things real data cannot offer:
false-negative masking inside a training batch (:class:`FitsOracle`) and the oracle recall bound of a split
(:func:`oracle_metrics`), which tells how much of the benchmark is caption ambiguity rather than model error.

Structured records use small integer codes: a shape/colour/size is an index into ``config.shapes`` /
``config.colours`` / :data:`SIZES`, a cell is ``row * 3 + col`` (0 = top left, 8 = bottom right), and
``-1`` means "empty cell" in scenes and "not asserted" (wildcard) in captions.

Modules, one job each:

- :mod:`.config`: :class:`SyntheticConfig` and the vocabularies (shapes, colours, sizes, relations, cells).
- :mod:`.records`: the struct-of-arrays records of scenes, sparse captions and dense captions.
- :mod:`.scenes`: scene sampling and :func:`render_scenes`.
- :mod:`.captions`: the sparse caption templates and the noisy dense descriptions.
- :mod:`.fits`: the fits relation (:func:`evaluate_fits`, :class:`FitsOracle`).
- :mod:`.oracle`: the oracle recall bound (:func:`oracle_metrics`).
- :mod:`.negatives`: compositional hard negatives of every caption (:func:`hard_negatives`).
- :mod:`.geometry`: the pixels and ViT patches each object covers (:func:`split_object_patches`).
- :mod:`.dataset`: :class:`SceneSplit`, :func:`generate_split` and the cached :class:`SyntheticScenes`.
"""

from __future__ import annotations

from patchword.data.synthetic.config import (
    CELL_NAMES,
    CELL_PHRASES,
    COLOURS,
    RELATIONS,
    SHAPES,
    SIZES,
    SPLITS,
    SyntheticConfig,
)
from patchword.data.synthetic.config import GENERATOR_VERSION as GENERATOR_VERSION
from patchword.data.synthetic.config import GRID as GRID
from patchword.data.synthetic.config import MAX_CAPTION_OBJECTS as MAX_CAPTION_OBJECTS
from patchword.data.synthetic.config import NUM_CELLS as NUM_CELLS
from patchword.data.synthetic.dataset import SceneSplit, SyntheticScenes, default_cache_dir, generate_split
from patchword.data.synthetic.fits import FitsOracle, evaluate_fits
from patchword.data.synthetic.geometry import (
    ObjectLayout,
    object_label_map,
    object_layout,
    object_patch_masks,
    split_layout,
    split_object_patches,
)
from patchword.data.synthetic.negatives import NEGATIVE_KINDS, HardNegatives, hard_negatives
from patchword.data.synthetic.oracle import oracle_metrics
from patchword.data.synthetic.records import CaptionSpec, CaptionTable, DenseTable, ObjectRef, SceneTable
from patchword.data.synthetic.scenes import render_scenes

__all__ = [
    "SyntheticConfig",
    "SyntheticScenes",
    "SceneSplit",
    "SceneTable",
    "CaptionTable",
    "DenseTable",
    "ObjectRef",
    "CaptionSpec",
    "FitsOracle",
    "evaluate_fits",
    "generate_split",
    "oracle_metrics",
    "render_scenes",
    "hard_negatives",
    "HardNegatives",
    "NEGATIVE_KINDS",
    "ObjectLayout",
    "object_layout",
    "split_layout",
    "object_label_map",
    "object_patch_masks",
    "split_object_patches",
    "default_cache_dir",
    "SHAPES",
    "COLOURS",
    "SIZES",
    "RELATIONS",
    "CELL_NAMES",
    "CELL_PHRASES",
    "SPLITS",
]
