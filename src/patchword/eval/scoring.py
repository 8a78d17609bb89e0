"""Encode a split once and score every image against every caption in bounded-memory blocks."""

from __future__ import annotations

import logging
import sys

import torch
from tqdm.auto import tqdm

__all__ = ["encode_image_tokens", "encode_text_tokens", "chunked_scores"]

_logger = logging.getLogger(__name__)


def _progress(total: int, desc: str, enabled: bool | None) -> tqdm:
    # Bars only where a person watches: a TTY on stderr, unless explicitly asked for.
    disable = not sys.stderr.isatty() if enabled is None else not enabled
    return tqdm(total=total, desc=desc, disable=disable, leave=False)


@torch.no_grad()
def encode_image_tokens(
    model, images, *, batch_size: int = 128, device: torch.device | str = "cpu", progress: bool | None = None
) -> torch.Tensor:
    """Run the image encoder once per image: -> (N_img, L_v, C) float32 tokens on the CPU."""
    out = []
    n = len(images)
    with _progress(n, "encode images", progress) as bar:
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
    with _progress(ids.shape[0], desc, progress) as bar:
        for start in range(0, ids.shape[0], batch_size):
            part = slice(start, start + batch_size)
            # Trim each batch to its longest text: padding costs attention time and changes nothing.
            width = int(lens[part].max())
            tokens = model.encode_texts(ids[part, :width].to(device), lens[part].to(device)).float().cpu()
            out.append(torch.nn.functional.pad(tokens, (0, 0, 0, ids.shape[1] - width)))
            bar.update(tokens.shape[0])
    return torch.cat(out)


@torch.no_grad()
def chunked_scores(
    matcher,
    img_tokens: torch.Tensor,
    cap_tokens: torch.Tensor,
    cap_lens: torch.Tensor,
    dense_tokens: torch.Tensor | None = None,
    dense_lens: torch.Tensor | None = None,
    *,
    txt2img: torch.Tensor | None = None,
    pairs_per_block: int = 8192,
    image_block: int = 128,
    device: torch.device | str = "cpu",
    progress: bool | None = None,
) -> torch.Tensor:
    """The full (N_img, N_txt) similarity matrix through the matcher's own forward, block by block.

    Memory is bounded by ``pairs_per_block`` (image_block x caption block pairs are scored at a time).
    Dense tokens are (N_img, L_d, C), one per image; when the matcher pairs dense text with captions
    (``dense_pairing="caption"``) caption j uses the dense text of image ``txt2img[j]``.

    Returns:
        (N_img, N_txt) float32 on the CPU.
    """
    n_img, n_txt = img_tokens.shape[0], cap_tokens.shape[0]
    caption_pairing = getattr(getattr(matcher, "config", None), "dense_pairing", "image") == "caption"
    if dense_tokens is not None and caption_pairing and txt2img is None:
        raise ValueError("txt2img is required to pair dense text with captions")
    image_block = max(1, min(image_block, n_img))
    caption_block = max(1, pairs_per_block // image_block)
    sims = torch.empty(n_img, n_txt)
    blocks = -(-n_img // image_block) * -(-n_txt // caption_block)
    with _progress(blocks, "score pairs", progress) as bar:
        for i0 in range(0, n_img, image_block):
            img = img_tokens[i0 : i0 + image_block].to(device)
            img_dense = None
            if dense_tokens is not None and not caption_pairing:
                img_dense = (
                    dense_tokens[i0 : i0 + image_block].to(device),
                    dense_lens[i0 : i0 + image_block],
                )
            for t0 in range(0, n_txt, caption_block):
                part = slice(t0, t0 + caption_block)
                width = int(cap_lens[part].max())
                dense = img_dense
                if dense_tokens is not None and caption_pairing:
                    owner = txt2img[part]
                    dense = (dense_tokens[owner].to(device), dense_lens[owner])
                args = (None, None) if dense is None else (dense[0], dense[1].to(device))
                out = matcher(img, cap_tokens[part, :width].to(device), cap_lens[part].to(device), *args)
                sims[i0 : i0 + image_block, part] = out.sims.float().cpu()
                bar.update(1)
    return sims
