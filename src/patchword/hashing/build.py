"""From a :class:`~patchword.hashing.config.HashRunConfig` section to the objects it describes.

The checks that need the data (how many pairs a file holds, the feature widths) are made here, naming the
config key (or the file) they concern, before a run directory is written.
"""

from __future__ import annotations

from patchword.errors import ConfigError, DataError
from patchword.hashing.config import HashDataConfig, HashModelConfig
from patchword.hashing.dataset import HashDataset, split_dataset
from patchword.hashing.model import UCMFH
from patchword.hashing.readers import load_mat, load_pairs, load_split_dir
from patchword.hashing.synthetic import synthetic_dataset

__all__ = ["build_hashing_dataset", "build_hashing_model"]


def build_hashing_dataset(dc: HashDataConfig) -> HashDataset:
    """The train / query / retrieval :class:`HashDataset` described by ``dc`` (read or generated).

    Raises:
        ConfigError: a split size (``data.num_query`` / ``data.num_train``) the data cannot give, naming
            the key; a training set of fewer than two pairs (no contrastive batch) names the keys too.
        DataError: a split file whose training split holds fewer than two pairs, naming it.
    """
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
        _check_split_sizes(len(full), full.labels is not None, dc, full.source)
        data = split_dataset(full, num_query=dc.num_query, num_train=dc.num_train, seed=dc.split_seed)
    elif dc.format == "splits":
        data = load_split_dir(dc.root)
    elif dc.format == "mat":
        try:
            data = load_mat(dc.root, num_query=dc.num_query, num_train=dc.num_train, seed=dc.split_seed)
        except DataError:
            raise
        except ValueError as err:  # split_dataset's size errors name its arguments, not the config keys
            key = "data.num_train" if str(err).startswith("num_train") else "data.num_query"
            raise ConfigError(key, f"{err} ({dc.root})") from None
    else:
        raise ConfigError("data.format", f"must be synthetic, pairs, splits or mat, got {dc.format!r}")
    if len(data.train) < 2:  # all batches were dropped: the run reported 0 steps and exit 0
        if data.info.get("split_seed") is None:  # the file's own training split
            raise DataError(
                f"{data.train.source}: {len(data.train)} training pair(s); a contrastive batch needs 2"
            )
        raise ConfigError(
            "data.num_query",
            f"leaves {len(data.train)} training pair(s) of {data.info.get('source')} (data.num_query="
            f"{dc.num_query}, data.num_train={dc.num_train}); a contrastive batch needs at least 2",
        )
    return data


def _check_split_sizes(n: int, labelled: bool, dc: HashDataConfig, source: str) -> None:
    """The sizes :func:`split_dataset` is asked for fit the ``n`` pairs of ``source``, checked first: its
    own errors name its arguments, not the config keys."""
    if not 0 < dc.num_query < n:
        raise ConfigError("data.num_query", f"must lie in [1, {n - 1}] for the {n} pairs of {source}")
    rest = n - dc.num_query
    if labelled and dc.num_train > rest:
        raise ConfigError(
            "data.num_train",
            f"{dc.num_train} exceeds the {rest} retrieval pairs of {source} (n - data.num_query)",
        )
    if not labelled and min(dc.num_train, rest) < 2:  # pair-only data train on what the queries leave
        raise ConfigError(
            "data.num_query",
            f"data.num_query={dc.num_query} of the {n} pairs of {source} leaves {min(dc.num_train, rest)} "
            f"training pair(s) (data.num_train={dc.num_train}); a contrastive batch needs at least 2",
        )


def build_hashing_model(mc: HashModelConfig, image_dim: int, text_dim: int) -> UCMFH:
    """A freshly initialised :class:`UCMFH` for ``image_dim`` / ``text_dim`` input features.

    Raises:
        ConfigError: ``model.nhead`` does not divide an encoder width (known only with the data).
    """
    widths = [image_dim + text_dim] if mc.fusion == "official_fused" else [image_dim, text_dim]
    for width in widths:
        if mc.nhead < 1 or width % mc.nhead:
            raise ConfigError(
                "model.nhead",
                f"must divide the encoder width {width} (model.fusion={mc.fusion}), got {mc.nhead}",
            )
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
