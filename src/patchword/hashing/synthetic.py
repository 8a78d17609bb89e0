"""Seeded synthetic multi-label image / text features for tests and benchmarks of cross-modal hashing."""

from __future__ import annotations

from typing import Any

import numpy as np

from patchword.hashing.dataset import HashDataset, HashSplit, make_split, multi_hot_labels

__all__ = ["make_synthetic_multilabel", "synthetic_dataset"]


def make_synthetic_multilabel(
    num: int,
    *,
    num_labels: int = 24,
    image_dim: int = 512,
    text_dim: int = 512,
    latent_dim: int = 64,
    instance_noise: float = 1.0,
    feature_noise: float = 1.0,
    labels: np.ndarray | None = None,
    seed: int = 0,
) -> HashSplit:
    """Seeded multi-label image/text features whose cross-modal relation must be learned.

    Every sample gets 1-4 labels (Zipf-like label frequencies, or the given ``labels`` rows, e.g. the
    real MIRFlickr-25K matrix), a latent ``z = norm(sum of its label prototypes / sqrt(#labels) +
    instance_noise * e)``, an image feature ``norm(A z + feature_noise * e_i)`` and a text feature
    ``norm(tanh(2 B z) + feature_noise * e_t)`` with random maps A, B. The modalities live in unrelated
    spaces (raw cross-modal cosine is chance), the instance noise makes pairs distinguishable beyond their
    labels (so an unsupervised pair loss has signal), and label sharing makes latents similar.

    Returns:
        A :class:`HashSplit` with (num, image_dim), (num, text_dim) features and (num, L) labels.
    """
    rng = np.random.default_rng(seed)
    if labels is None:
        weights = 1.0 / np.arange(1, num_labels + 1) ** 0.7
        weights /= weights.sum()
        labels = np.zeros((num, num_labels), dtype=np.uint8)
        counts = rng.choice([1, 2, 3, 4], size=num, p=[0.4, 0.3, 0.2, 0.1])
        for c in (1, 2, 3, 4):  # vectorised per label count: draw without replacement by Gumbel top-c
            rows = np.flatnonzero(counts == c)
            keys = np.log(weights)[None, :] - np.log(-np.log(rng.random((rows.size, num_labels))))
            labels[rows[:, None], np.argsort(-keys, axis=1)[:, :c]] = 1
    else:
        labels = multi_hot_labels(labels, "labels", "labels", num)
        num_labels = labels.shape[1]
    # Unit-norm label prototypes and instance noise of norm ~instance_noise: their ratio sets how much of a
    # sample is "its labels" versus "itself".
    protos = rng.standard_normal((num_labels, latent_dim)) / np.sqrt(latent_dim)
    z = labels.astype(np.float64) @ protos / np.sqrt(np.maximum(labels.sum(1, keepdims=True), 1))
    z += instance_noise * rng.standard_normal(z.shape) / np.sqrt(latent_dim)
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    # Signals of unit norm, isotropic noise of norm ~feature_noise on top.
    image = z @ rng.standard_normal((latent_dim, image_dim))
    image /= np.linalg.norm(image, axis=1, keepdims=True)
    text = np.tanh(2 * z @ rng.standard_normal((latent_dim, text_dim)))
    text /= np.linalg.norm(text, axis=1, keepdims=True)
    image += feature_noise * rng.standard_normal(image.shape) / np.sqrt(image_dim)
    text += feature_noise * rng.standard_normal(text.shape) / np.sqrt(text_dim)
    image /= np.linalg.norm(image, axis=1, keepdims=True)
    text /= np.linalg.norm(text, axis=1, keepdims=True)
    return make_split(image, text, labels, source=f"synthetic(seed={seed})")


def synthetic_dataset(
    *, num_train: int = 2000, num_query: int = 500, num_retrieval: int = 4000, seed: int = 0, **kwargs: Any
) -> HashDataset:
    """A labelled synthetic :class:`HashDataset`: disjoint query / retrieval, train a subset of retrieval."""
    if num_train > num_retrieval:
        raise ValueError(f"num_train ({num_train}) cannot exceed num_retrieval ({num_retrieval})")
    full = make_synthetic_multilabel(num_query + num_retrieval, seed=seed, **kwargs)
    query = full.subset(np.arange(num_query))
    retrieval = full.subset(np.arange(num_query, num_query + num_retrieval))
    train = retrieval.subset(np.arange(num_train))
    return HashDataset(train, query, retrieval, info={"source": full.source, "protocol": "labels"})
