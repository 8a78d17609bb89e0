"""Generation config and the fixed vocabularies of the synthetic scenes (shapes, colours, sizes, cells)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from patchword.errors import ConfigError

# Bump when generation changes in any way that alters the output, so stale caches are never reused.
GENERATOR_VERSION = 1

GRID = 3
NUM_CELLS = GRID * GRID
SPLITS = ("train", "dev", "test")
SHAPES = ("circle", "square", "triangle", "diamond", "cross")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 210, 30),
    "orange": (245, 140, 30),
    "purple": (140, 50, 180),
    "cyan": (30, 200, 210),
    "black": (25, 25, 25),
}
SIZES = ("small", "large")
RELATIONS = ("left of", "right of", "above", "below")
CELL_NAMES = (
    "top left",
    "top middle",
    "top right",
    "middle left",
    "centre",
    "middle right",
    "bottom left",
    "bottom middle",
    "bottom right",
)
# Sparse captions name cells tersely to stay short; dense captions use CELL_NAMES.
CELL_PHRASES = (
    "in the top left",
    "at the top",
    "in the top right",
    "on the left",
    "in the centre",
    "on the right",
    "in the bottom left",
    "at the bottom",
    "in the bottom right",
)
# Largest sparse caption: three objects (the relation and count templates use two).
MAX_CAPTION_OBJECTS = 3
#: The most images a split may hold: a split is generated in memory (64 px: 12 KiB an image), so more is
#: a typo (``num_test=100000000`` asked numpy for 1.1 TiB), refused naming the key, not an allocation error.
MAX_SPLIT_IMAGES = 10_000_000


@dataclass(frozen=True)
class SyntheticConfig:
    """Everything that determines the generated dataset; equal configs give identical data."""

    seed: int = 0  # master seed; each split derives its own stream from it
    image_size: int = 64  # side of the square RGB images in pixels
    min_objects: int = 1  # fewest objects per image (one per grid cell, so at most 9)
    max_objects: int = 4  # most objects per image
    shapes: tuple[str, ...] = SHAPES  # shape vocabulary, a subset of SHAPES
    colours: tuple[str, ...] = tuple(COLOURS)  # colour vocabulary, a subset of COLOURS
    background: tuple[int, int, int] = (210, 210, 210)  # background RGB (dense text calls it light grey)
    pixel_noise: float = 3.0  # std of mild Gaussian pixel noise (0 = perfectly flat colours)
    jitter: float = 0.12  # max object offset from its cell centre, as a fraction of the cell side
    num_train: int = 10_000  # train images (Flickr30K-shaped, just smaller)
    num_dev: int = 1_000  # dev images
    num_test: int = 1_000  # test images
    captions_per_image: int = 5  # sparse captions per image
    partial_attr_prob: float = 0.1  # chance a sparse caption leaves out one attribute of an object
    dense_omit_prob: float = 0.15  # chance the dense caption misses an object (as MLLMs do)
    dense_wrong_attr_prob: float = 0.1  # chance the dense caption gets one attribute of an object wrong
    # chance that an object (after the first) copies the colour or the shape of another object of its
    # scene: distractors a caption's description must be told apart from (0 draws nothing extra)
    attribute_repeat_prob: float = 0.0

    def __post_init__(self) -> None:
        # Each error names the field (ConfigError.key): a caller that sets the fields from its own config
        # keys (the run config's data section: data_key_error) names those instead.
        if not 1 <= self.min_objects <= self.max_objects <= NUM_CELLS:
            raise ConfigError(
                "min_objects" if self.min_objects < 1 else "max_objects",
                f"need 1 <= min_objects <= max_objects <= {NUM_CELLS} (at most one object per grid cell), "
                f"got {self.min_objects}..{self.max_objects}",
            )
        for name, values, known in (
            ("shapes", self.shapes, SHAPES),
            ("colours", self.colours, tuple(COLOURS)),
        ):
            if len(values) < 2 or not set(values) <= set(known):
                raise ConfigError(name, f"need >= 2 of {known}, got {values}")
        if self.image_size < 4 * GRID:
            raise ConfigError(
                "image_size",
                f"must be >= {4 * GRID} (at least 4 pixels per grid cell), got {self.image_size}",
            )
        if not 1 <= self.captions_per_image <= 5:
            raise ConfigError("captions_per_image", f"must be in 1..5, got {self.captions_per_image}")
        for name in (
            "partial_attr_prob",
            "dense_omit_prob",
            "dense_wrong_attr_prob",
            "attribute_repeat_prob",
        ):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(name, f"must be a probability, got {getattr(self, name)}")
        for split in SPLITS:
            if self.split_size(split) < 1:
                raise ConfigError(
                    f"num_{split}", f"every split needs at least one image, got {self.split_size(split)}"
                )
            if self.split_size(split) > MAX_SPLIT_IMAGES:
                raise ConfigError(
                    f"num_{split}",
                    f"at most {MAX_SPLIT_IMAGES:,} images a split (generated in memory), got "
                    f"{self.split_size(split):,}",
                )

    def split_size(self, split: str) -> int:
        """Number of images of ``split``."""
        return {"train": self.num_train, "dev": self.num_dev, "test": self.num_test}[split]

    def cache_key(self) -> str:
        """Short stable hash of the config and generator version, naming its cache directory."""
        payload = json.dumps({"version": GENERATOR_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


#: Named generator settings (``data.synthetic_scenes``). ``simple`` is the generator as it was first
#: shipped (the pretrained ``synthetic-64`` encoders and every earlier figure); ``cluttered`` is closer to
#: photos: COCO images hold about 7 labelled objects and a caption names 2-3 of them, so a scene holds 5-9
#: objects (7 on average) of which a caption names at most 3, and half of the objects share their colour or
#: shape with another one (distractors of the named ones).
SCENE_PRESETS: dict[str, dict[str, object]] = {
    "simple": {},
    "cluttered": {"min_objects": 5, "max_objects": 9, "attribute_repeat_prob": 0.5},
}


#: The run config key (``data`` section) that sets each generator field; the fields not listed come from
#: the preset that ``data.synthetic_scenes`` names (``patchword.data.config.DataConfig.synthetic_config``,
#: whose errors name these keys).
DATA_KEYS: dict[str, str] = {
    "seed": "data.synthetic_seed",
    "image_size": "data.synthetic_image_size",
    "num_train": "data.num_train",
    "num_dev": "data.num_dev",
    "num_test": "data.num_test",
    "dense_omit_prob": "data.dense_omit_prob",
    "dense_wrong_attr_prob": "data.dense_wrong_attr_prob",
}
