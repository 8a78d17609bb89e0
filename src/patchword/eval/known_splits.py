"""Which published test split a split's captions are, read from the captions themselves.

A published number (Flickr30K 1K test, MS-COCO 5K test) is comparable with a measured one only when the
measured captions are that split's. The folder a user's data lies in names nothing for certain; the
captions do. Each known split ships as the sorted 64-bit hashes of its captions' keys
(:func:`caption_key`: lowercase letters and digits only, HTML entities decoded, so that the SCAN files'
tokenised ``hat .``, Karpathy's ``hat.`` and Multi30K's ``&amp;`` give one key), made from the public
files in ``shared/data`` by ``benchmarks/make_known_splits.py``; no caption text is shipped.

:func:`identify_captions` counts, for the best-matching known split, how many of a split's captions are
among its captions. Flickr8K's images are Flickr30K images, so a Flickr8K test set shares some captions
with the Flickr30K test (147 of 5000): the best match, not any match, names the data.
"""

from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

__all__ = ["KNOWN_SPLITS", "KnownSplit", "caption_key", "caption_hashes", "identify_captions"]


@dataclass(frozen=True)
class KnownSplit:
    """A published test split: the dataset it belongs to (``f30k``, ``coco``, ``f8k``), its name in
    words, and its number of captions (with repeats; the shipped hashes are the distinct ones)."""

    dataset: str
    label: str
    captions: int


#: name -> split; the hashes are ``known_splits/{name}.npy`` in this package.
KNOWN_SPLITS = {
    "f30k_1k_test": KnownSplit("f30k", "Flickr30K 1K test", 5000),
    "coco_5k_test": KnownSplit("coco", "MS-COCO 5K test", 25000),
    "f8k_1k_test": KnownSplit("f8k", "Flickr8K 1K test", 5000),
}

_WORD = re.compile(r"[a-z0-9]+")


def caption_key(text: str) -> str:
    """``text`` as the letters and digits it holds, lowercased, HTML entities (``&amp;``, doubly escaped
    ones too) decoded first: the same caption tokenised or punctuated differently has one key."""
    return "".join(_WORD.findall(html.unescape(html.unescape(text)).lower()))


def caption_hashes(captions: Sequence[str]) -> np.ndarray:
    """(N,) uint64: the first 8 bytes of the BLAKE2b digest of each caption's :func:`caption_key`."""
    out = np.empty(len(captions), dtype=np.uint64)
    for i, text in enumerate(captions):
        digest = hashlib.blake2b(caption_key(text).encode("utf-8"), digest_size=8).digest()
        out[i] = int.from_bytes(digest, "little")
    return out


@cache
def _known_hashes(name: str) -> np.ndarray:
    with resources.files("patchword.eval").joinpath("known_splits", f"{name}.npy").open("rb") as fh:
        return np.load(fh, allow_pickle=False)


def identify_captions(captions: Sequence[str]) -> dict[str, object] | None:
    """The known split most of ``captions`` belong to: ``{"split": name, "dataset": "f30k" | "coco" |
    "f8k", "found": how many of the captions are among its captions, "captions": len(captions)}``; None when
    none of them is any known split's caption (other data, generated scenes)."""
    if not captions:
        return None
    measured = caption_hashes(captions)
    best, found = None, 0
    for name in KNOWN_SPLITS:
        count = int(np.isin(measured, _known_hashes(name), assume_unique=False).sum())
        if count > found:
            best, found = name, count
    if best is None:
        return None
    return {"split": best, "dataset": KNOWN_SPLITS[best].dataset, "found": found, "captions": len(captions)}
