"""The one canonical split object every dataset reader produces."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["RetrievalSplit"]


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
    """

    name: str
    images: object
    captions: list[str]
    txt2img: np.ndarray
    image_ids: list[str] = field(default_factory=list)
    dense_captions: list[str] | None = None
    fits: np.ndarray | None = None

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
        )

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
        if self.dense_captions is not None and len(self.dense_captions) != n_img:
            raise ValueError(
                f"split {self.name!r}: {len(self.dense_captions)} dense captions for {n_img} images"
            )
        if self.fits is not None and self.fits.shape != (len(self.captions), n_img):
            raise ValueError(
                f"split {self.name!r}: fits has shape {self.fits.shape}, "
                f"expected ({len(self.captions)}, {n_img})"
            )
