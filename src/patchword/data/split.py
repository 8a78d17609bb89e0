"""The one canonical split object every dataset reader produces."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["RetrievalSplit", "TextOrigin", "qualified_ids"]


def qualified_ids(image_ids: list[str], fields: list[str]) -> list[str]:
    """Each image id qualified by the field it was read from (``cocoid:5``): ids of different fields are
    different images (a Karpathy json's ``cocoid`` 5 and ``imgid`` 5)."""
    return [f"{source}:{image_id}" for source, image_id in zip(fields, image_ids, strict=True)]


@dataclass(frozen=True)
class TextOrigin:
    """Where each text of a split was read, so that an error about one text can name its file and line.

    Attributes:
        file: the file the texts were read from.
        places: (N,) 1-based line numbers, or (N, 2) ``(entry, sentence)`` indices of a Karpathy json
            (``images[entry].sentences[sentence]``).
    """

    file: str
    places: np.ndarray

    def describe(self, index: int) -> str:
        """``FILE:LINE`` (or ``FILE: images[i].sentences[k]``) of text ``index``."""
        place = self.places[index]
        if place.ndim == 0:
            return f"{self.file}:{int(place)}"
        return f"{self.file}: images[{int(place[0])}].sentences[{int(place[1])}]"

    def take(self, indices) -> TextOrigin:
        """The origins of the texts at ``indices``, in that order."""
        return TextOrigin(self.file, self.places[np.asarray(indices, dtype=np.int64)])


@dataclass
class RetrievalSplit:
    """A retrieval split: images, captions and the caption -> image map.

    Attributes:
        name: split name (``train``, ``dev``, ``test``...).
        images: per-image payload; a (N_img, H, W, 3) uint8 array for in-memory images, or a list of
            file paths for on-disk datasets.
        captions: the N_txt caption strings.
        txt2img: (N_txt,) int64 index of the image each caption describes.
        image_ids: (N_img,) identifiers of the images (dataset ids or file names).
        dense_captions: optional N_img dense (MLLM-style) descriptions, one per image, in image order.
        fits: optional (N_txt, N_img) boolean matrix, True where caption t is a correct description of
            image v (a superset of the ground-truth pairs). Synthetic data knows it; real data does not.
        caption_origin / dense_origin: where the file readers read each caption / dense caption (None for
            generated text); errors about one text name its file and line with them.
        image_id_fields: optional (N_img,) name of the field each image id was read from (a Karpathy json:
            ``cocoid``, ``imgid``, or ``file`` for an entry with neither): ids read from different fields
            name different images whatever their values (COCO id 5 is not Karpathy index 5). None: the ids
            share one namespace.
    """

    name: str
    images: object
    captions: list[str]
    txt2img: np.ndarray
    image_ids: list[str] = field(default_factory=list)
    dense_captions: list[str] | None = None
    fits: np.ndarray | None = None
    caption_origin: TextOrigin | None = None
    dense_origin: TextOrigin | None = None
    image_id_fields: list[str] | None = None

    @property
    def num_images(self) -> int:
        return len(self.images)

    def subset(self, image_indices, name: str | None = None) -> RetrievalSplit:
        """The images ``image_indices`` (distinct, in that order) with exactly their captions, dense
        captions and fits rows/columns."""
        idx = np.asarray(image_indices, dtype=np.int64)
        position = np.full(self.num_images, -1, dtype=np.int64)
        position[idx] = np.arange(len(idx))
        new_img = position[self.txt2img]
        keep = np.flatnonzero(new_img >= 0)
        images = self.images[idx] if isinstance(self.images, np.ndarray) else [self.images[i] for i in idx]
        return RetrievalSplit(
            name=name or self.name,
            images=images,
            captions=[self.captions[i] for i in keep],
            txt2img=new_img[keep],
            image_ids=[self.image_ids[i] for i in idx] if self.image_ids else [],
            dense_captions=None if self.dense_captions is None else [self.dense_captions[i] for i in idx],
            fits=None if self.fits is None else self.fits[np.ix_(keep, idx)],
            caption_origin=None if self.caption_origin is None else self.caption_origin.take(keep),
            dense_origin=None if self.dense_origin is None else self.dense_origin.take(idx),
            image_id_fields=None if self.image_id_fields is None else [self.image_id_fields[i] for i in idx],
        )

    def image_keys(self) -> list[str]:
        """(N_img,) the image ids, each qualified by the field it was read from when the split records one
        (``cocoid:5``): equal keys are the same image; compare ids of two splits (or two images) by them."""
        if self.image_id_fields is None:
            return list(self.image_ids)
        return qualified_ids(self.image_ids, self.image_id_fields)

    def caption_place(self, index: int) -> str:
        """Where caption ``index`` was read (``FILE:LINE``), or its index in the split for generated text."""
        if self.caption_origin is None:
            return f"split {self.name!r} caption {index}"
        return self.caption_origin.describe(index)

    def dense_place(self, index: int) -> str:
        """Where the dense caption of image ``index`` was read, or its image index for generated text."""
        if self.dense_origin is None:
            return f"split {self.name!r} dense caption of image {index}"
        return self.dense_origin.describe(index)

    @property
    def num_captions(self) -> int:
        return len(self.captions)

    def __post_init__(self) -> None:
        self.txt2img = np.asarray(self.txt2img, dtype=np.int64)
        n_img = len(self.images)
        if self.txt2img.shape != (len(self.captions),):
            raise ValueError(
                f"split {self.name!r}: txt2img has shape {self.txt2img.shape}, "
                f"expected ({len(self.captions)},) (one image index per caption)"
            )
        if len(self.txt2img) and (self.txt2img.min() < 0 or self.txt2img.max() >= n_img):
            raise ValueError(f"split {self.name!r}: txt2img points outside the {n_img} images")
        for i, cap in enumerate(self.captions):
            if not cap or not cap.strip():
                raise ValueError(f"split {self.name!r}: caption {i} is empty")
        if self.image_id_fields is not None and len(self.image_id_fields) != len(self.image_ids):
            raise ValueError(
                f"split {self.name!r}: {len(self.image_id_fields)} id fields for "
                f"{len(self.image_ids)} image ids"
            )
        if self.dense_captions is not None and len(self.dense_captions) != n_img:
            raise ValueError(
                f"split {self.name!r}: {len(self.dense_captions)} dense captions for {n_img} images"
            )
        if self.fits is not None and self.fits.shape != (len(self.captions), n_img):
            raise ValueError(
                f"split {self.name!r}: fits has shape {self.fits.shape}, "
                f"expected ({len(self.captions)}, {n_img})"
            )
