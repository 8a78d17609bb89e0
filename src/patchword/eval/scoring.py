"""Encode a split once: image and text tokens for every item, in batches, on the CPU.

Both helpers run the model in eval mode (dropout off: the same input gives the same tokens every time) and
put it back in the mode it was in, as :func:`~patchword.eval.engine.score_matrix` does; that switch
(:func:`eval_mode`) and the check of a ``device`` argument (:func:`patchword.device.checked_device`) serve
the two-stage search too.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

from patchword._validation import check_lengths
from patchword.device import checked_device
from patchword.progress import progress_bar

__all__ = ["encode_image_tokens", "encode_text_tokens"]

_logger = logging.getLogger(__name__)


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode within the block, back in its previous mode (train or eval) after it."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@torch.no_grad()
def encode_image_tokens(
    model, images, *, batch_size: int = 128, device: torch.device | str = "cpu", progress: bool | None = None
) -> torch.Tensor:
    """Run the image encoder once per image: -> (N_img, L_v, C) float32 tokens on the CPU.

    ``images``: the encoder's inputs as one tensor, (N_img, ...) (pixels (N_img, 3, H, W), or the region
    features of a precomputed-feature model), or an image set with ``batch(indices, train=False)`` (a
    dataset's images, read batch by batch). The model runs in eval mode and is put back in its previous
    mode afterwards."""
    device = checked_device(device)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if isinstance(images, torch.Tensor):
        if images.ndim < 2:
            raise ValueError(f"images as a tensor must be (N_img, ...), got shape {tuple(images.shape)}")

        def read(idx: torch.Tensor) -> torch.Tensor:
            return images[idx[0] : idx[-1] + 1]

    elif callable(getattr(images, "batch", None)):

        def read(idx: torch.Tensor) -> torch.Tensor:
            return images.batch(idx, train=False)

    else:
        raise TypeError(
            f"images must be a tensor (N_img, ...) or an image set with batch(indices, train), "
            f"got {type(images).__name__}"
        )
    out = []
    n = len(images)
    with eval_mode(model), progress_bar(n, "encode images", progress) as bar:
        for start in range(0, n, batch_size):
            idx = torch.arange(start, min(start + batch_size, n))
            out.append(model.encode_images(read(idx).to(device)).float().cpu())
            bar.update(len(idx))
    return torch.cat(out)


@torch.no_grad()
def encode_text_tokens(
    model,
    ids: torch.Tensor,
    lens: object,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    progress: bool | None = None,
    desc: str = "encode captions",
) -> torch.Tensor:
    """Run the text encoder once per text: (N, L) ids -> (N, L, C) float32 tokens on the CPU.

    ``lens``: (N,) valid lengths, a tensor or a sequence of ints, at most L. The model runs in eval mode
    and is put back in its previous mode afterwards."""
    # min_len=0: encoding reads no minimum; the matcher that scores the tokens checks its own
    lens = check_lengths(lens, "lens", size=ids.shape[0], max_len=ids.shape[1], min_len=0)
    device = checked_device(device)
    out = []
    with eval_mode(model), progress_bar(ids.shape[0], desc, progress) as bar:
        for start in range(0, ids.shape[0], batch_size):
            part = slice(start, start + batch_size)
            # Trim each batch to its longest text: padding costs attention time and changes nothing.
            width = int(lens[part].max())
            tokens = model.encode_texts(ids[part, :width].to(device), lens[part].to(device)).float().cpu()
            out.append(torch.nn.functional.pad(tokens, (0, 0, 0, ids.shape[1] - width)))
            bar.update(tokens.shape[0])
    return torch.cat(out)
