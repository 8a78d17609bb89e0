"""A trained run directory as a usable model: the one place that reads ``config.yaml``, the tokenizer and
a checkpoint back (``patchword eval``, index building, search, serving, plots and benchmarks all use it).

A run directory written by ``patchword train`` holds ``config.yaml`` (the resolved :class:`RunConfig`,
written once), ``vocab.json`` (word tokenizers), ``best.pt`` / ``last.pt`` and ``export/``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from patchword.errors import ConfigError
from patchword.model import RetrievalModel
from patchword.precision import weight_dtype
from patchword.train.checkpoint import load_checkpoint
from patchword.train.config import RunConfig
from patchword.train.rundir import (
    build_run_model,
    config_hash,
    load_run_tokenizer,
    read_run_config,
    resolve_checkpoint,
)

__all__ = [
    "LoadedRun",
    "load_run",
    "read_run_config",
    "load_run_tokenizer",
    "config_hash",
    "resolve_checkpoint",
]


@dataclass
class LoadedRun:
    """A run directory loaded for inference.

    Attributes:
        run_dir: the directory.
        config: its resolved :class:`RunConfig` (plus any in-memory overrides).
        model: the :class:`RetrievalModel` with the checkpoint's weights, in eval mode, on ``device``.
        tokenizer: the run's text tokenizer.
        checkpoint: the weights file that was loaded.
        device: where the model lives.
    """

    run_dir: Path
    config: RunConfig
    model: RetrievalModel
    tokenizer: object
    checkpoint: Path
    device: torch.device

    @property
    def image_size(self) -> int:
        """Square input side of the image encoder in pixels."""
        size = getattr(self.model.image_encoder, "image_size", None)
        if size is None:
            raise ValueError(f"{self.run_dir}: the image encoder does not take images (region features?)")
        return int(size)

    def image_transform(self):
        """PIL image -> (3, H, W) float32 tensor, preprocessed as the image encoder expects."""
        from patchword.data.transforms import test_transform

        enc = self.model.image_encoder
        return test_transform(self.image_size, enc.image_mean, enc.image_std)

    def preprocess_images(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """PIL images -> (B, 3, H, W) float32 on the CPU."""
        transform = self.image_transform()
        return torch.stack([transform(image.convert("RGB")) for image in images])

    def tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Captions -> ((B, L) ids, (B,) lens), truncated to ``data.max_caption_len`` as in training."""
        return self.tokenizer.batch_encode(list(texts), max_len=self.config.data.max_caption_len)


def load_run(
    run_dir: str | Path,
    checkpoint: str | Path | None = None,
    *,
    device: str | torch.device = "cpu",
    overrides: Sequence[str] = (),
) -> LoadedRun:
    """Load ``run_dir`` (config, tokenizer, weights) for inference.

    Args:
        run_dir: a directory written by ``patchword train`` (or the demo).
        checkpoint: a file inside ``run_dir`` (``best.pt``, ``last.pt``) or a path; default ``best.pt``.
        device: where to put the model.
        overrides: dotted config overrides applied in memory (e.g. ``eval.max_memory_mb=4096``).

    Raises:
        MissingFileError: no such run directory, no config.yaml, no vocabulary or no checkpoint.
    """
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir, overrides)
    path = resolve_checkpoint(run_dir, checkpoint)
    tokenizer = load_run_tokenizer(run_dir, cfg.data)
    from patchword.data.tokenizers import WordVocab

    words = list(tokenizer.idx2word) if isinstance(tokenizer, WordVocab) else None
    model = build_run_model(run_dir, cfg, len(words) if words else None, words)
    model.to(weight_dtype(cfg.precision))  # before loading: an fp64 run's weights stay fp64
    try:
        model.load_state_dict(load_checkpoint(path)["model"])
    except RuntimeError as err:  # shapes or names differ: the overrides changed the architecture
        detail = str(err).split("\n\t", 2)
        raise ConfigError(
            "model",
            f"the weights in {path} do not fit the model this config builds"
            f"{' (overrides: ' + ' '.join(overrides) + ')' if overrides else ''}: {' '.join(detail[1:2])}",
        ) from None
    device = torch.device(device)
    model.to(device).eval()
    return LoadedRun(run_dir, cfg, model, tokenizer, path, device)
