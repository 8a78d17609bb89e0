"""Encode a split once: image and text tokens for every item, in batches, on the CPU."""

from __future__ import annotations

import logging

import torch

from patchword.progress import progress_bar

__all__ = ["encode_image_tokens", "encode_text_tokens"]

_logger = logging.getLogger(__name__)


@torch.no_grad()
def encode_image_tokens(
    model, images, *, batch_size: int = 128, device: torch.device | str = "cpu", progress: bool | None = None
) -> torch.Tensor:
    """Run the image encoder once per image: -> (N_img, L_v, C) float32 tokens on the CPU."""
    out = []
    n = len(images)
    with progress_bar(n, "encode images", progress) as bar:
        for start in range(0, n, batch_size):
            idx = torch.arange(start, min(start + batch_size, n))
            batch = images.batch(idx, train=False).to(device)
            out.append(model.encode_images(batch).float().cpu())
            bar.update(len(idx))
    return torch.cat(out)


@torch.no_grad()
def encode_text_tokens(
    model,
    ids: torch.Tensor,
    lens: torch.Tensor,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    progress: bool | None = None,
    desc: str = "encode captions",
) -> torch.Tensor:
    """Run the text encoder once per text: (N, L) ids -> (N, L, C) float32 tokens on the CPU."""
    out = []
    with progress_bar(ids.shape[0], desc, progress) as bar:
        for start in range(0, ids.shape[0], batch_size):
            part = slice(start, start + batch_size)
            # Trim each batch to its longest text: padding costs attention time and changes nothing.
            width = int(lens[part].max())
            tokens = model.encode_texts(ids[part, :width].to(device), lens[part].to(device)).float().cpu()
            out.append(torch.nn.functional.pad(tokens, (0, 0, 0, ids.shape[1] - width)))
            bar.update(tokens.shape[0])
    return torch.cat(out)
