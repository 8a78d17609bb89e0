"""The official UCMFH forward (XinyuXia97/UCMFH ``model.py`` / ``ICMR.py``), computed from a checkpoint's
own tensors under their official names; the yardstick of the UCMFH importer's tests.

Written from reference/tgdt_ucmfh.md B.2 and the official modules' structure:

* ``FuseTransEncoder``: ``nn.TransformerEncoder`` (post-norm, ReLU, 4 heads as hard-coded in ``ICMR.py``,
  sequence first) over ``concat(image, text)``; its output is L2-normalised over all ``D`` dimensions and
  split at ``D / 2`` into the "image" and "text" features. Training feeds ``(1, B, D)`` (B sequences of
  length 1); the evaluation feeds the 2-D ``(B, D)`` block of each 128-pair loader batch, which PyTorch
  reads as one unbatched sequence: the block's pairs attend to each other.
* ``ImageMlp`` / ``TextMlp``: ``L2norm -> fc1 -> ReLU -> Dropout -> tohash -> tanh -> L2norm``; codes are
  ``torch.sign`` of the outputs.

The layers are written out from the tensors (:func:`patchword.testing.official_tgdt.transformer_layer`),
not through ``nn.TransformerEncoder``. :func:`official_ucmfh_checkpoint` makes random weights in the layout
``utils.save_checkpoints`` writes for a hash run (task 1).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from patchword.testing.official_tgdt import transformer_stack

__all__ = [
    "OFFICIAL_BLOCK",
    "OFFICIAL_HEADS",
    "official_ucmfh_checkpoint",
    "official_ucmfh_eval",
    "official_ucmfh_train_features",
]

#: ``nhead`` of the official fusion encoder and its evaluation batch size (``ICMR.Solver``).
OFFICIAL_HEADS = 4
OFFICIAL_BLOCK = 128
_ENC = "transformerEncoder."


def _mlp(state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``ImageMlp`` / ``TextMlp`` in eval mode: (N, d) -> (N, bits) unit vectors."""
    h = F.relu(F.linear(F.normalize(x, dim=1), state["fc1.weight"], state["fc1.bias"]))
    return F.normalize(torch.tanh(F.linear(h, state["tohash.weight"], state["tohash.bias"])), dim=1)


def _split(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = F.normalize(out.reshape(-1, out.shape[-1]), dim=1)
    half = out.shape[1] // 2
    return out[:, :half], out[:, half:]


@torch.no_grad()
def official_ucmfh_train_features(
    ckpt: dict[str, dict[str, torch.Tensor]], image: torch.Tensor, text: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``FuseTrans(tokens.unsqueeze(0))`` as training calls it (eval mode): every pair alone.

    Returns:
        ``(image features (N, D/2), text features (N, D/2))``, the halves of the unit fused vector.
    """
    tokens = torch.cat([image, text], dim=1)[:, None]  # (N, 1, D) batch first = (1, N, D) sequence first
    return _split(transformer_stack(tokens, ckpt["FusionTransformer"], _ENC, OFFICIAL_HEADS))


@torch.no_grad()
def official_ucmfh_eval(
    ckpt: dict[str, dict[str, torch.Tensor]],
    image: torch.Tensor,
    text: torch.Tensor,
    block: int = OFFICIAL_BLOCK,
) -> dict[str, torch.Tensor]:
    """``Solver.evaluate`` for a hash model: per block of ``block`` consecutive pairs (the loader batch), the
    2-D call of the fusion encoder, the heads, ``torch.sign``.

    The official loaders drop a last incomplete block (``drop_last=True``); here it is encoded as a smaller
    block, as the official forward would encode it.

    Returns:
        ``{"img_feat", "txt_feat"}`` (N, D/2) fused halves, ``{"img_hash", "txt_hash"}`` (N, bits) unit
        real-valued codes, ``{"img_code", "txt_code"}`` their signs.
    """
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("img_feat", "txt_feat", "img_hash", "txt_hash")}
    for start in range(0, image.shape[0], block):
        tokens = torch.cat([image[start : start + block], text[start : start + block]], dim=1)
        # one unbatched sequence of the block's pairs: (1, n, D) batch first
        img, txt = _split(transformer_stack(tokens[None], ckpt["FusionTransformer"], _ENC, OFFICIAL_HEADS))
        parts["img_feat"].append(img)
        parts["txt_feat"].append(txt)
        parts["img_hash"].append(_mlp(ckpt["ImageMlp"], img))
        parts["txt_hash"].append(_mlp(ckpt["TextMlp"], txt))
    out = {k: torch.cat(v) for k, v in parts.items()}
    out["img_code"], out["txt_code"] = torch.sign(out["img_hash"]), torch.sign(out["txt_hash"])
    return out


def official_ucmfh_checkpoint(
    feat_dim: int, bits: int, *, layers: int = 2, ffn_dim: int = 2048, hidden: int = 4096, seed: int = 0
) -> dict[str, dict[str, torch.Tensor]]:
    """Random weights as ``save_checkpoints`` stores a hash run: ``{"FusionTransformer", "ImageMlp",
    "TextMlp"}`` state dicts (official: ``feat_dim`` 512, fused width 1024, ``hidden`` 4096).

    Values are off their initialisation: LayerNorm scales around 1, biases non-zero.
    """
    gen = torch.Generator().manual_seed(seed)
    width = 2 * feat_dim

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen) / (math.sqrt(shape[-1]) if len(shape) > 1 else 5.0)

    fusion: dict[str, torch.Tensor] = {}
    for i in range(layers):
        p = f"{_ENC}layers.{i}."
        fusion[p + "self_attn.in_proj_weight"] = rand(3 * width, width)
        fusion[p + "self_attn.in_proj_bias"] = rand(3 * width)
        fusion[p + "self_attn.out_proj.weight"] = rand(width, width)
        fusion[p + "self_attn.out_proj.bias"] = rand(width)
        fusion[p + "linear1.weight"] = rand(ffn_dim, width)
        fusion[p + "linear1.bias"] = rand(ffn_dim)
        fusion[p + "linear2.weight"] = rand(width, ffn_dim)
        fusion[p + "linear2.bias"] = rand(width)
        for norm in ("norm1", "norm2"):
            fusion[f"{p}{norm}.weight"] = 1.0 + rand(width)
            fusion[f"{p}{norm}.bias"] = rand(width)

    def head() -> dict[str, torch.Tensor]:
        return {
            "fc1.weight": rand(hidden, feat_dim),
            "fc1.bias": rand(hidden),
            "tohash.weight": rand(bits, hidden),
            "tohash.bias": rand(bits),
        }

    return {"FusionTransformer": fusion, "ImageMlp": head(), "TextMlp": head()}
