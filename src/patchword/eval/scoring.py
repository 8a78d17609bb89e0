"""Encode a split once: image and text tokens for every item, in batches, returned on the CPU.

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

from patchword._validation import check_lengths, check_positive_int, check_tensor, check_token_ids_dtype
from patchword.device import checked_device, module_device
from patchword.matching.ops import full_precision
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
    model,
    images,
    *,
    batch_size: int = 128,
    device: torch.device | str | None = None,
    progress: bool | None = None,
) -> torch.Tensor:
    """Run the image encoder once per image: -> (N_img, L_v, C) float32 tokens on the CPU
    (float64 from a float64 model, ``precision=fp64``; half precision comes back as float32).

    ``images``: the encoder's inputs as one tensor, (N_img, ...) (pixels (N_img, 3, H, W), or the region
    features of a precomputed-feature model), or an image set with ``batch(indices, train=False)`` (a
    dataset's images, read batch by batch). ``device``: where the encoder runs (default: the model's, its
    first parameter's). The model runs in eval mode and is put back in its previous mode afterwards.

    Raises:
        ValueError: no images (the token count L_v of the result is the encoder's to say, from an image),
            integer pixels (:meth:`~patchword.model.RetrievalModel.encode_images`), a bad ``batch_size``.
    """
    device = module_device(model) if device is None else checked_device(device)
    batch_size = check_positive_int("batch_size", batch_size)
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
    n = len(images)
    if n == 0:
        raise ValueError("images: no images to encode (0 given)")
    out = []
    with eval_mode(model), progress_bar(n, "encode images", progress) as bar:
        for start in range(0, n, batch_size):
            idx = torch.arange(start, min(start + batch_size, n))
            out.append(full_precision(model.encode_images(read(idx).to(device))).cpu())
            bar.update(len(idx))
    return torch.cat(out)


@torch.no_grad()
def encode_text_tokens(
    model,
    ids: torch.Tensor,
    lens: object,
    *,
    batch_size: int = 256,
    device: torch.device | str | None = None,
    progress: bool | None = None,
    desc: str = "encode captions",
) -> torch.Tensor:
    """Run the text encoder once per text: (N, L) ids -> (N, L, C) float32 tokens on the CPU (float64
    from a float64 model, ``precision=fp64``).

    ``lens``: (N,) valid lengths, a tensor or a sequence of ints, at most L. ``device``: where the encoder
    runs (default: the model's, its first parameter's). The model runs in eval mode and is put back in its
    previous mode afterwards.

    Raises:
        ValueError: no texts (the width C of the result is the encoder's to say, from a text); ids that
            are not (N, L) int64 / int32, or an id outside the text encoder's vocabulary (checked once
            here, on the positions the encoder reads, not in every training step); bad ``lens``.
    """
    check_tensor(ids, "ids", ndim=2, finite=False, floating=False)
    if ids.shape[0] == 0:
        raise ValueError("ids: no texts to encode (0 given)")
    # min_len=0: encoding reads no minimum; the matcher that scores the tokens checks its own
    lens = check_lengths(lens, "lens", size=ids.shape[0], max_len=ids.shape[1], min_len=0)
    device = module_device(model) if device is None else checked_device(device)
    # once per call, on the positions the encoder reads (every batch is trimmed to its longest text)
    vocab_size = getattr(getattr(model, "text_encoder", None), "vocab_size", None)
    _check_token_ids(ids[:, : int(lens.max())], vocab_size)
    out = []
    with eval_mode(model), progress_bar(ids.shape[0], desc, progress) as bar:
        for start in range(0, ids.shape[0], batch_size):
            part = slice(start, start + batch_size)
            # Trim each batch to its longest text: padding costs attention time and changes nothing.
            width = int(lens[part].max())
            # host lengths: the encoder checks them there (no wait) and uploads them itself
            tokens = model.encode_texts(ids[part, :width].to(device, non_blocking=True), lens[part])
            tokens = full_precision(tokens).cpu()
            out.append(torch.nn.functional.pad(tokens, (0, 0, 0, ids.shape[1] - width)))
            bar.update(tokens.shape[0])
    return torch.cat(out)


def _check_token_ids(ids: torch.Tensor, vocab_size: int | None) -> None:
    """(N, L) ids a text encoder can read: int64 or int32 (float ids were torch's error about index scalar
    types), each in ``[0, vocab_size)`` (None: ``>= 0``; torch's "index out of range in self" named neither
    the argument nor the id). One read of the ids on their device, once per call: the model's
    ``encode_texts``, which a training step calls, checks the dtype only.

    Raises:
        ValueError: naming ``ids`` and the dtype, or the id out of range.
    """
    check_token_ids_dtype(ids)
    if ids.numel() == 0:
        return
    low, high = torch.stack([ids.min(), ids.max()]).tolist()
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        within = f"in [0, {vocab_size})" if vocab_size is not None else ">= 0"
        raise ValueError(
            f"ids: token id {low if low < 0 else high} is outside the text encoder's vocabulary (ids must "
            f"be {within})"
        )
