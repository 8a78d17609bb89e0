"""From a :class:`~patchword.hashing.config.HashRunConfig` section to the objects it describes."""

from __future__ import annotations

from patchword.errors import ConfigError
from patchword.hashing.config import HashDataConfig, HashModelConfig
from patchword.hashing.dataset import HashDataset, split_dataset
from patchword.hashing.model import UCMFH
from patchword.hashing.readers import load_mat, load_pairs, load_split_dir
from patchword.hashing.synthetic import synthetic_dataset

__all__ = ["build_hashing_dataset", "build_hashing_model"]


def build_hashing_dataset(dc: HashDataConfig) -> HashDataset:
    """The train / query / retrieval :class:`HashDataset` described by ``dc`` (read or generated)."""
    if dc.format == "synthetic":
        return synthetic_dataset(
            num_train=dc.num_train,
            num_query=dc.num_query,
            num_retrieval=dc.synthetic_num_retrieval,
            seed=dc.synthetic_seed,
            image_dim=dc.synthetic_image_dim,
            text_dim=dc.synthetic_text_dim,
        )
    if dc.format == "pairs":
        if not dc.image or not dc.text:
            raise ConfigError("data.image", "data.format=pairs needs data.image and data.text (.npy files)")
        full = load_pairs(dc.image, dc.text, dc.labels or None)
        return split_dataset(full, num_query=dc.num_query, num_train=dc.num_train, seed=dc.split_seed)
    if dc.format == "splits":
        return load_split_dir(dc.root)
    if dc.format == "mat":
        return load_mat(dc.root, num_query=dc.num_query, num_train=dc.num_train, seed=dc.split_seed)
    raise ConfigError("data.format", f"must be synthetic, pairs, splits or mat, got {dc.format!r}")


def build_hashing_model(mc: HashModelConfig, image_dim: int, text_dim: int) -> UCMFH:
    """A freshly initialised :class:`UCMFH` for ``image_dim`` / ``text_dim`` input features."""
    return UCMFH(
        image_dim,
        text_dim,
        mc.bits,
        fusion=mc.fusion,
        nhead=mc.nhead,
        num_layers=mc.num_layers,
        dim_feedforward=mc.dim_feedforward,
        dropout=mc.dropout,
        hidden=mc.hidden,
        head_dropout=mc.head_dropout,
        eval_batch_size=mc.eval_batch_size,
    )
