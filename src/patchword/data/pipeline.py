"""Turn a :class:`RetrievalSplit` into the tensors the model consumes, once, before training.

Captions (and dense captions) are tokenised once into an :class:`EncodedSplit`; images stay behind an
:class:`ImageSource` that decodes and normalises a batch on demand (in-memory arrays, image files, or
region features). Training, evaluation and search all consume these two types.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from patchword.data.split import RetrievalSplit
from patchword.data.tokenizers import NoWordsError, TextTokenizer, WordVocab
from patchword.data.transforms import IMAGENET_MEAN, IMAGENET_STD, normalize_uint8_batch
from patchword.errors import DataError

if TYPE_CHECKING:
    from PIL import Image

__all__ = [
    "ImageSource",
    "ArrayImages",
    "FileImages",
    "SelectedImages",
    "EncodedSplit",
    "encode_split",
    "text_without_words",
    "unknown_words_warning",
    "load_images",
    "reads_files",
    "train_image_seeds",
]

_logger = logging.getLogger(__name__)


class ImageSource(Protocol):
    """Images of a split by index."""

    def __len__(self) -> int: ...

    def batch(self, indices: torch.Tensor, train: bool) -> torch.Tensor:
        """(B,) indices -> (B, 3, H, W) float32 normalised images."""
        ...


class ArrayImages:
    """In-memory uint8 images (the synthetic scenes); normalised per batch to keep memory small.

    No augmentation: flipping or cropping a synthetic scene would falsify its "left of" and position
    captions.
    """

    def __init__(self, images: np.ndarray, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> None:
        if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
            raise ValueError(f"images must be a (N, H, W, 3) uint8 array, got {images.shape} {images.dtype}")
        self.images = torch.from_numpy(np.ascontiguousarray(images))
        self.mean, self.std = mean, std

    def __len__(self) -> int:
        return self.images.shape[0]

    def batch(self, indices: torch.Tensor, train: bool) -> torch.Tensor:
        return normalize_uint8_batch(self.images[indices], self.mean, self.std)


@dataclass
class EncodedSplit:
    """A split as tensors: tokenised captions (and dense captions per image), images by index.

    Attributes:
        cap_ids: (N_txt, L) caption token ids; cap_lens (N_txt,).
        dense_ids: (N_img, L_d) dense-caption ids, one per image, or None; dense_lens (N_img,).
        txt2img: (N_txt,) image index of each caption.
        fits: optional ``fits(caption_indices, image_indices) -> (len(c), len(i)) bool`` relation used
            to mask false negatives (synthetic data); None for real data.
        captions / dense_captions: the texts (dense: one per image, or None), kept for train-time
            re-tokenisation with augmentation and for display.
    """

    name: str
    images: ImageSource
    cap_ids: torch.Tensor
    cap_lens: torch.Tensor
    txt2img: torch.Tensor
    captions: list[str]
    dense_ids: torch.Tensor | None = None
    dense_lens: torch.Tensor | None = None
    fits: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
    dense_captions: list[str] | None = None

    @property
    def num_images(self) -> int:
        return len(self.images)

    @property
    def num_captions(self) -> int:
        return self.cap_ids.shape[0]

    def select_images(self, indices: torch.Tensor | Sequence[int], name: str | None = None) -> EncodedSplit:
        """The images at ``indices`` (in that order) with exactly their captions and dense captions.

        One mechanism for every "part of a split": the first images of dev (cheaper validation), the
        COCO 1K folds of the 5K test, the training images held out as a dev split.
        """
        indices = torch.as_tensor(indices, dtype=torch.long)
        position = torch.full((self.num_images,), -1, dtype=torch.long)
        position[indices] = torch.arange(len(indices))
        new_img = position[self.txt2img]
        keep = (new_img >= 0).nonzero().squeeze(1)
        fits = None
        if self.fits is not None:
            parent, cap_of, img_of = self.fits, keep.numpy(), indices.numpy()

            def fits(c: np.ndarray, i: np.ndarray) -> np.ndarray:
                return parent(cap_of[c], img_of[i])

        return EncodedSplit(
            name=name or f"{self.name}[{len(indices)} images]",
            images=SelectedImages(self.images, indices),
            cap_ids=self.cap_ids[keep],
            cap_lens=self.cap_lens[keep],
            txt2img=new_img[keep],
            captions=[self.captions[i] for i in keep.tolist()],
            dense_ids=None if self.dense_ids is None else self.dense_ids[indices],
            dense_lens=None if self.dense_lens is None else self.dense_lens[indices],
            fits=fits,
            dense_captions=None if self.dense_captions is None else [self.dense_captions[i] for i in indices],
        )

    def first_images(self, n: int) -> EncodedSplit:
        """The first ``n`` images and their captions (the whole split when ``n <= 0`` or ``n >= N``)."""
        if n <= 0 or n >= self.num_images:
            return self
        return self.select_images(torch.arange(n), name=f"{self.name}[:{n}]")


class SelectedImages:
    """The images ``indices`` of another :class:`ImageSource`, renumbered 0..len(indices)-1."""

    def __init__(self, source: ImageSource, indices: torch.Tensor) -> None:
        # Selecting from a selection composes the index maps instead of nesting wrappers.
        if isinstance(source, SelectedImages):
            source, indices = source.source, source.indices[indices]
        self.source, self.indices = source, indices

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def seeded_augmentation(self) -> bool:
        return getattr(self.source, "seeded_augmentation", False)

    @property
    def reads_files(self) -> bool:
        return reads_files(self.source)

    def batch(self, indices: torch.Tensor, train: bool, seeds: Sequence[int] | None = None) -> torch.Tensor:
        rows = self.indices[torch.as_tensor(indices, dtype=torch.long)]
        return load_images(self.source, rows, train=train, seeds=seeds)


def reads_files(source: ImageSource) -> bool:
    """Whether ``source`` decodes files per batch (worth DataLoader workers), not in-memory arrays."""
    return bool(getattr(source, "reads_files", False))


def train_image_seeds(seed: int, step: int, positions: Sequence[int]) -> list[int]:
    """Seeds of the train-time augmentation of the images at ``positions`` of the global batch of
    ``step``: every image's crop and flip depend on (seed, step, position) only, so they are the same
    whichever process and DataLoader worker loads it, and after a resume."""
    base = (seed * 1_000_003 + step) * 65_537
    return [base + int(p) for p in positions]


def load_images(
    source: ImageSource, indices: torch.Tensor, *, train: bool, seeds: Sequence[int] | None = None
) -> torch.Tensor:
    """``source.batch(indices, train)``, with one augmentation seed per image (:func:`train_image_seeds`)
    for the sources that augment (image files); sources without augmentation ignore ``seeds``."""
    if seeds is not None and getattr(source, "seeded_augmentation", False):
        return source.batch(indices, train, seeds=seeds)
    return source.batch(indices, train)


def text_without_words(
    split: RetrievalSplit, err: NoWordsError, *, dense: bool, index: int | None = None
) -> DataError:
    """The error for caption ``index`` (default ``err.index``; with ``dense``, the dense caption of image
    ``index``) of ``split`` that the tokenizer finds no word in, naming the file and line it was read from."""
    index = err.index if index is None else index
    place = split.dense_place(index) if dense else split.caption_place(index)
    what = "dense caption" if dense else "caption"
    return DataError(f"{place}: the {what} {err.text!r} has {err.reason}; reword or remove it")


#: Share of a split's caption words read only as the unknown token above which preparing the split warns.
#: A vocabulary of the captions' own language and dataset leaves few words unknown (BERT's WordPiece only
#: characters it lacks; one built from the training captions none of theirs, some rare words of dev and
#: test); over half, most of what the text encoder reads is the unknown token: a vocabulary that is not the
#: text's (another language or dataset, a placeholder). Lower, a right vocabulary built with a high
#: data.vocab_min_count from a small training split could warn. Warned, not refused: a user may mean it.
UNKNOWN_WORDS_WARN = 0.5
#: Captions (spread evenly over the split) the share is counted on: the same cost on any split (2000 BERT
#: basic tokenisations, 0.5 s measured on a busy 2-core machine), the share within a few percent of the
#: whole split's.
UNKNOWN_WORDS_SAMPLE = 2000


def unknown_words_warning(split: RetrievalSplit, tokenizer: TextTokenizer) -> str | None:
    """One line when more than :data:`UNKNOWN_WORDS_WARN` of the caption words of ``split`` (each word
    counted once per caption, on at most :data:`UNKNOWN_WORDS_SAMPLE` captions) are words ``tokenizer`` can
    only encode as its unknown token, naming the vocabulary, the share and the commonest such words; None
    otherwise."""
    n = split.num_captions
    picked = np.unique(np.linspace(0, n - 1, min(n, UNKNOWN_WORDS_SAMPLE)).round().astype(np.int64))
    total, unknown = 0, Counter()
    for i in picked.tolist():
        known, missing = tokenizer.known_and_unknown_words(split.captions[i])
        total += len(known) + len(missing)
        unknown.update(missing)
    count = sum(unknown.values())
    if not total or count <= UNKNOWN_WORDS_WARN * total:
        return None
    word = isinstance(tokenizer, WordVocab)
    unk, key = ("<unk>", "data.vocab_path") if word else ("[UNK]", "data.bert_vocab")
    if tokenizer.source:
        where = f"{tokenizer.source} ({key})"
    else:  # a vocabulary built now from the training captions (unknown words in dev / test only)
        where = "built from the training captions (data.vocab_min_count)" if word else "given as a mapping"
    sampled = " sampled" if len(picked) < n else ""
    examples = ", ".join(repr(w) for w, _ in unknown.most_common(5))
    return (
        f"split {split.name!r}: {count / total:.0%} of the caption words ({count} of {total} in "
        f"{len(picked)}{sampled} captions) are unknown to the vocabulary {where} and read as {unk}, e.g. "
        f"{examples}: are the vocabulary and the captions of one language and dataset?"
    )


def encode_split(
    split: RetrievalSplit,
    tokenizer: TextTokenizer,
    images: ImageSource,
    *,
    max_caption_len: int,
    max_dense_len: int,
    use_dense: bool,
    fits: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> EncodedSplit:
    """Tokenise captions (and dense captions) of ``split``; the same max lengths serve training and
    evaluation (no test-time truncation surprises, SPEC decision 6)."""
    if len(images) != split.num_images:
        raise DataError(f"split {split.name!r}: {len(images)} images for {split.num_images} image entries")
    try:
        cap_ids, cap_lens = tokenizer.batch_encode(split.captions, max_len=max_caption_len)
    except NoWordsError as err:
        raise text_without_words(split, err, dense=False) from err
    reached = int((cap_lens == max_caption_len).sum())
    if reached:  # longer captions were cut to the limit, silently but for this count
        _logger.info(
            "%s: %d of %d captions reach max_caption_len=%d (longer ones are cut to it)",
            split.name,
            reached,
            split.num_captions,
            max_caption_len,
        )
    dense_ids = dense_lens = None
    if use_dense:
        if split.dense_captions is None:
            raise DataError(
                f"split {split.name!r} has no dense captions but the model reads them: give the split's "
                "dense jsonl (data.dense_<split>) or set data.dense=false"
            )
        try:
            dense_ids, dense_lens = tokenizer.batch_encode(split.dense_captions, max_len=max_dense_len)
        except NoWordsError as err:
            raise text_without_words(split, err, dense=True) from err
        truncated = int((dense_lens == max_dense_len).sum())
        if truncated:
            _logger.info("%s: %d dense captions reach max_dense_len=%d", split.name, truncated, max_dense_len)
    if fits is None and split.fits is not None:
        matrix = split.fits

        def fits(c: np.ndarray, i: np.ndarray) -> np.ndarray:
            return matrix[np.ix_(c, i)]

    return EncodedSplit(
        name=split.name,
        images=images,
        cap_ids=cap_ids,
        cap_lens=cap_lens,
        txt2img=torch.as_tensor(split.txt2img, dtype=torch.long),
        captions=list(split.captions),
        dense_ids=dense_ids,
        dense_lens=dense_lens,
        fits=fits,
        dense_captions=list(split.dense_captions) if use_dense else None,
    )


class FileImages:
    """Images on disk (real datasets): decoded and transformed per batch.

    Training batches use the official augmentation (RandomResizedCrop scale 0.6-1 + flip), evaluation a
    plain resize; both normalise with ImageNet statistics. ``exif_orientation``: turn each image upright as
    its EXIF orientation tag says (``data.exif_orientation``; off, as the official loaders read the
    benchmark datasets).
    """

    seeded_augmentation = True  # batch(..., seeds=) draws each image's crop and flip from its own seed
    reads_files = True

    def __init__(self, paths: Sequence[str], image_size: int, exif_orientation: bool = False) -> None:
        from patchword.data.transforms import test_transform, train_transform

        self.paths = list(paths)
        self.image_size = image_size
        self.exif_orientation = exif_orientation
        self.train_tf = train_transform(image_size)
        self.test_tf = test_transform(image_size)

    def __len__(self) -> int:
        return len(self.paths)

    def batch(self, indices: torch.Tensor, train: bool, seeds: Sequence[int] | None = None) -> torch.Tensor:
        """(B,) indices -> (B, 3, H, W). Training augmentation draws from torch's global RNG, or, with
        ``seeds`` (one per image), from a generator seeded by each: reproducible in any worker process."""
        from patchword.data.transforms import train_transform

        if not train:
            return torch.stack([self._image(i, self.test_tf) for i in indices])
        if seeds is None:
            return torch.stack([self._image(i, self.train_tf) for i in indices])
        if len(seeds) != len(indices):
            raise ValueError(f"{len(seeds)} seeds for {len(indices)} images")
        out = []
        for i, seed in zip(indices, seeds, strict=True):
            tf = train_transform(self.image_size, generator=torch.Generator().manual_seed(int(seed)))
            out.append(self._image(i, tf))
        return torch.stack(out)

    def _image(self, index, transform: Callable[[Image.Image], torch.Tensor]) -> torch.Tensor:
        from patchword.data.images import load_transformed

        return load_transformed(self.paths[int(index)], transform, exif_orientation=self.exif_orientation)
