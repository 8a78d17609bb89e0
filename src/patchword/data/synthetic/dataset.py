"""Splits and the dataset: generation, the canonical retrieval splits and the on-disk cache."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from patchword.data.split import RetrievalSplit
from patchword.data.synthetic.captions import _CaptionWriter, _dense_table, _DenseWriter
from patchword.data.synthetic.config import SPLITS, SyntheticConfig
from patchword.data.synthetic.fits import FitsOracle
from patchword.data.synthetic.records import CaptionTable, DenseTable, SceneTable
from patchword.data.synthetic.scenes import _sample_scenes, render_scenes
from patchword.fileio import staging_dir

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class SceneSplit:
    """Everything the generator knows about one split.

    Attributes:
        name: split name.
        images: (N, H, W, 3) uint8.
        scenes: structured content of the N images.
        captions: the T = 5N sparse captions, image-major (captions 5i..5i+4 describe image i).
        caption_specs: structured content of the captions.
        txt2img: (T,) int64 ground-truth image per caption.
        dense_captions: N dense descriptions.
        dense_specs: what each dense description says (noise included).
    """

    name: str
    images: np.ndarray
    scenes: SceneTable
    captions: list[str]
    caption_specs: CaptionTable
    txt2img: np.ndarray
    dense_captions: list[str]
    dense_specs: DenseTable
    _oracle: FitsOracle | None = field(default=None, init=False, repr=False)

    @property
    def oracle(self) -> FitsOracle:
        """The split's :class:`FitsOracle`."""
        if self._oracle is None:
            self._oracle = FitsOracle(self.caption_specs, self.scenes)
        return self._oracle

    @property
    def image_ids(self) -> list[str]:
        return [f"syn-{self.name}-{i:06d}" for i in range(len(self.scenes))]

    def to_retrieval_split(self, with_fits: bool | None = None) -> RetrievalSplit:
        """The canonical :class:`RetrievalSplit`.

        ``fits`` is materialised when ``with_fits``, by default for every split but train: its
        (50000, 10000) matrix would take 500 MB, and a trainer only needs batch blocks of it, which
        :attr:`oracle` answers on demand.
        """
        if with_fits is None:
            with_fits = self.name != "train"
        return RetrievalSplit(
            name=self.name,
            images=self.images,
            captions=self.captions,
            txt2img=self.txt2img,
            image_ids=self.image_ids,
            dense_captions=self.dense_captions,
            fits=self.oracle.matrix() if with_fits else None,
        )

    def check(self) -> None:
        """Raise if a caption does not fit its own image (a generator bug, never a data property)."""
        ok = self.oracle.pairs(np.arange(len(self.captions)), self.txt2img)
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise AssertionError(f"{self.name} caption {bad} {self.captions[bad]!r} does not fit its image")

    # -- persistence -----------------------------------------------------------------------------------

    def save(self, directory: Path) -> None:
        np.save(directory / f"{self.name}_images.npy", self.images)
        np.savez(
            directory / f"{self.name}_specs.npz",
            txt2img=self.txt2img,
            **self.scenes.to_arrays("scene_"),
            **self.caption_specs.to_arrays("caption_"),
            **self.dense_specs.to_arrays("dense_"),
        )
        text = {"captions": self.captions, "dense_captions": self.dense_captions}
        (directory / f"{self.name}_text.json").write_text(json.dumps(text))

    @classmethod
    def load(cls, directory: Path, name: str) -> SceneSplit:
        text = json.loads((directory / f"{name}_text.json").read_text())
        with np.load(directory / f"{name}_specs.npz") as arrays:
            return cls(
                name=name,
                images=np.load(directory / f"{name}_images.npy"),
                scenes=SceneTable.from_arrays(arrays, "scene_"),
                captions=text["captions"],
                caption_specs=CaptionTable.from_arrays(arrays, "caption_"),
                txt2img=arrays["txt2img"],
                dense_captions=text["dense_captions"],
                dense_specs=DenseTable.from_arrays(arrays, "dense_"),
            )


def generate_split(config: SyntheticConfig, name: str) -> SceneSplit:
    """Generate one split. Each split has its own random streams, so its content does not depend on the
    sizes of the other splits."""
    split_id = SPLITS.index(name)
    seq = np.random.SeedSequence([config.seed, split_id])
    scene_rng, render_rng, text_seed = (np.random.default_rng(s) for s in seq.spawn(3))
    # Python's Random is ~10x faster than numpy for the many scalar choices of caption writing.
    text_rng = random.Random(int(text_seed.integers(2**63)))
    n = config.split_size(name)
    scenes = _sample_scenes(config, n, scene_rng)
    images = render_scenes(scenes, config, render_rng)
    captions, specs, described, wrong, dense = [], [], [], [], []
    writer, dense_writer = _CaptionWriter(config, text_rng), _DenseWriter(config, text_rng)
    for i in range(n):
        objs = scenes.objects(i)
        for text, spec in writer.write(objs, config.captions_per_image):
            captions.append(text)
            specs.append(spec)
        description, objs_said, bad = dense_writer.write(objs)
        dense.append(description)
        described.append(objs_said)
        wrong.append(bad)
    split = SceneSplit(
        name=name,
        images=images,
        scenes=scenes,
        captions=captions,
        caption_specs=CaptionTable.from_specs(specs),
        txt2img=np.repeat(np.arange(n), config.captions_per_image),
        dense_captions=dense,
        dense_specs=_dense_table(n, described, wrong),
    )
    split.check()
    return split


def default_cache_dir() -> Path:
    """``$PATCHWORD_CACHE/synthetic`` if the variable is set, else ``~/.cache/patchword/synthetic``."""
    root = os.environ.get("PATCHWORD_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "patchword") / "synthetic"


def cache_target(config: SyntheticConfig, cache_dir: str | os.PathLike | None = None) -> Path:
    """The directory :meth:`SyntheticScenes.load_or_generate` caches the scenes of ``config`` in, under
    ``cache_dir`` (default :func:`default_cache_dir`); they are cached once it holds ``config.json``."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / f"synthetic-{config.cache_key()}"


class SyntheticScenes:
    """The synthetic scenes dataset: train / dev / test :class:`SceneSplit` s generated from one config.

    Use :meth:`generate` (in memory) or :meth:`load_or_generate` (cached on disk), then
    :meth:`split` for the canonical :class:`RetrievalSplit` and :meth:`oracle` / :meth:`fits` for the
    fits relation.
    """

    def __init__(self, config: SyntheticConfig, splits: dict[str, SceneSplit]) -> None:
        self.config = config
        self.scene_splits = splits
        self._retrieval: dict[str, RetrievalSplit] = {}

    @classmethod
    def generate(cls, config: SyntheticConfig | None = None) -> SyntheticScenes:
        """Generate all splits in memory."""
        config = config or SyntheticConfig()
        start = time.perf_counter()
        splits = {name: generate_split(config, name) for name in SPLITS}
        logger.info(
            "generated synthetic scenes %s (%d images) in %.1f s",
            config.cache_key(),
            sum(len(s.scenes) for s in splits.values()),
            time.perf_counter() - start,
        )
        return cls(config, splits)

    @classmethod
    def load_or_generate(
        cls, config: SyntheticConfig | None = None, cache_dir: str | os.PathLike | None = None
    ) -> SyntheticScenes:
        """Load the dataset from ``cache_dir/synthetic-<hash>/``, generating and caching it first if absent.

        Args:
            config: generation config (default :class:`SyntheticConfig`).
            cache_dir: cache root; default :func:`default_cache_dir`.
        """
        config = config or SyntheticConfig()
        target = cache_target(config, cache_dir)
        if (target / "config.json").exists():
            logger.info("loading synthetic scenes from %s", target)
            return cls(config, {name: SceneSplit.load(target, name) for name in SPLITS})
        dataset = cls.generate(config)
        dataset.save(target)
        return dataset

    def save(self, target: Path) -> None:
        """Write to ``target`` atomically: a reader sees either nothing or a complete directory."""
        target.parent.mkdir(parents=True, exist_ok=True)
        # staging_dir, as data/export.py: the renamed directory gets mkdir's permissions (the umask), not
        # mkdtemp's private 0700, which would lock other users out of a shared PATCHWORD_CACHE.
        tmp = Path(staging_dir(target, "tmp"))
        try:
            for split in self.scene_splits.values():
                split.save(tmp)
            # config.json last: its presence marks a complete directory.
            (tmp / "config.json").write_text(json.dumps(dataclasses.asdict(self.config), indent=2))
            os.replace(tmp, target)
        except OSError:
            if not (target / "config.json").exists():
                raise
            logger.info("another process cached %s first; keeping its copy", target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def split(self, name: str) -> RetrievalSplit:
        """The canonical :class:`RetrievalSplit` of ``name`` (``fits`` set for dev/test, None for train)."""
        if name not in self._retrieval:
            self._retrieval[name] = self[name].to_retrieval_split()
        return self._retrieval[name]

    @property
    def splits(self) -> dict[str, RetrievalSplit]:
        """All three canonical splits."""
        return {name: self.split(name) for name in SPLITS}

    def oracle(self, name: str) -> FitsOracle:
        """The :class:`FitsOracle` of split ``name``."""
        return self[name].oracle

    def fits(self, name: str, caption_indices: Sequence[int], image_indices: Sequence[int]) -> np.ndarray:
        """(len(caption_indices), len(image_indices)) bool fits sub-matrix of split ``name``."""
        return self.oracle(name)(caption_indices, image_indices)

    def __getitem__(self, name: str) -> SceneSplit:
        if name not in self.scene_splits:
            raise KeyError(f"unknown split {name!r}; expected one of {SPLITS}")
        return self.scene_splits[name]
