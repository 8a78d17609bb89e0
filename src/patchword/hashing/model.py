"""UCMFH: a transformer encoder over frozen CLIP features plus one hash head per modality.

Two encoder modes (SPEC decision 8):

* ``fusion="unimodal"`` (default): one encoder per modality. Each sample is a sequence of length 1,
  so an image code depends only on that image and a text code only on that text, at training and
  query time alike; batch samples never attend to each other. Codes of a database can be computed
  once and searched with any query, which is the premise of hashing.
* ``fusion="official_fused"``: the official ``FuseTransEncoder``. One ``nn.TransformerEncoder``
  (d_model = d_img + d_txt, batch_first=False) reads ``concat(image, text)``; its output is
  L2-normalised over all dimensions and split into the "image" and "text" halves. Training feeds
  ``(1, B, D)`` (sequence length 1), evaluation feeds ``(B, D)`` blocks of ``eval_batch_size`` (128),
  which PyTorch >= 1.11 reads as *one unbatched sequence*: the samples of an evaluation block attend to
  each other. So each modality's code depends on the paired other modality and on the batch. This mode
  exists to reproduce and measure the official numbers; its I->T / T->I results are fused-to-fused
  retrieval that uses the target's other modality at query time, not cross-modal hashing.

Hash heads (``ImageMlp`` / ``TextMlp``): ``x -> L2norm -> Linear(d, 4096) -> ReLU -> Dropout(0.3) ->
Linear(4096, bits) -> tanh``; codes are ``sign`` of the tanh output (``sign(0) = +1``). The official
heads L2-normalise the tanh output again, which changes neither the sign nor the (normalising) losses,
so it is left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from patchword._validation import check_tensor
from patchword.hashing.codes import binarize

__all__ = ["FUSION_MODES", "HashHead", "UCMFH", "UCMFHOutput"]

FUSION_MODES = ("unimodal", "official_fused")


class HashHead(nn.Module):
    """``L2norm -> Linear(in_dim, hidden) -> ReLU -> Dropout -> Linear(hidden, bits) -> tanh``.

    Args:
        in_dim: input feature dimension.
        bits: code length K.
        hidden: hidden width (4096 officially).
        dropout: dropout probability (0.3 officially).
    """

    def __init__(self, in_dim: int, bits: int, hidden: int = 4096, dropout: float = 0.3) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden)
        self.dropout = nn.Dropout(dropout)
        self.tohash = nn.Linear(hidden, bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_dim) -> (B, bits) continuous codes in (-1, 1)."""
        h = F.relu(self.fc1(F.normalize(x, dim=1)))
        return torch.tanh(self.tohash(self.dropout(h)))


def _encoder(
    d_model: int, nhead: int, num_layers: int, dim_feedforward: int, dropout: float, batch_first: bool
) -> nn.TransformerEncoder:
    # PyTorch defaults of the official code: post-LN, ReLU. Nested tensors only matter for padding masks.
    layer = nn.TransformerEncoderLayer(
        d_model=d_model,
        nhead=nhead,
        dim_feedforward=dim_feedforward,
        dropout=dropout,
        batch_first=batch_first,
    )
    return nn.TransformerEncoder(layer, num_layers=num_layers, enable_nested_tensor=False)


@dataclass
class UCMFHOutput:
    """Training-time outputs of one batch of B pairs.

    Attributes:
        img_feat: (B, d_img) encoder output of the image side (L2-normalised).
        txt_feat: (B, d_txt) encoder output of the text side.
        img_hash: (B, bits) continuous image codes (tanh).
        txt_hash: (B, bits) continuous text codes (tanh).
    """

    img_feat: torch.Tensor
    txt_feat: torch.Tensor
    img_hash: torch.Tensor
    txt_hash: torch.Tensor


class UCMFH(nn.Module):
    """UCMFH hashing model over pre-extracted image and text features.

    Args:
        image_dim: image feature dimension d_img.
        text_dim: text feature dimension d_txt.
        bits: code length (16, 32, 64, 128 in the paper).
        fusion: ``"unimodal"`` (default, codes of one modality depend only on it) or
            ``"official_fused"`` (official pair encoding with batch attention at evaluation; see module doc).
        nhead: attention heads (4 officially); must divide the encoder width.
        num_layers: encoder layers (2 officially).
        dim_feedforward: encoder FFN width (PyTorch default 2048, as officially).
        dropout: encoder dropout (PyTorch default 0.1).
        hidden: hash head width (4096).
        head_dropout: hash head dropout (0.3).
        eval_batch_size: block size of the official evaluation-time attention (128); only used by
            ``official_fused``.
    """

    def __init__(
        self,
        image_dim: int,
        text_dim: int,
        bits: int = 64,
        *,
        fusion: str = "unimodal",
        nhead: int = 4,
        num_layers: int = 2,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        hidden: int = 4096,
        head_dropout: float = 0.3,
        eval_batch_size: int = 128,
    ) -> None:
        super().__init__()
        if fusion not in FUSION_MODES:
            raise ValueError(f"fusion must be one of {FUSION_MODES}, got {fusion!r}")
        if int(bits) < 1:
            raise ValueError(f"bits must be >= 1, got {bits}")
        widths = [image_dim + text_dim] if fusion == "official_fused" else [image_dim, text_dim]
        for width in widths:
            if width % nhead:
                raise ValueError(f"nhead={nhead} must divide the encoder width {width}")
        self.image_dim, self.text_dim, self.bits = int(image_dim), int(text_dim), int(bits)
        self.fusion = fusion
        self.eval_batch_size = int(eval_batch_size)
        args = (nhead, num_layers, dim_feedforward, dropout)
        if fusion == "official_fused":
            self.fuse_encoder = _encoder(image_dim + text_dim, *args, batch_first=False)
        else:
            self.image_encoder = _encoder(image_dim, *args, batch_first=True)
            self.text_encoder = _encoder(text_dim, *args, batch_first=True)
        self.image_head = HashHead(image_dim, bits, hidden, head_dropout)
        self.text_head = HashHead(text_dim, bits, hidden, head_dropout)

    # ------------------------------------------------------------------ encoders
    def encoder_parameters(self) -> list[nn.Parameter]:
        """Parameters of the transformer part (official lr 1e-4)."""
        mods = (
            [self.fuse_encoder]
            if self.fusion == "official_fused"
            else [self.image_encoder, self.text_encoder]
        )
        return [p for m in mods for p in m.parameters()]

    def head_parameters(self) -> list[nn.Parameter]:
        """Parameters of the two hash heads (official lr 1e-3)."""
        return [*self.image_head.parameters(), *self.text_head.parameters()]

    def _check(self, x: torch.Tensor, name: str, dim: int) -> None:
        check_tensor(x, name, shape=(None, dim))

    def _fused(
        self, image: torch.Tensor, text: torch.Tensor, unbatched: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.cat([image, text], dim=1)  # (B, D)
        # Official: training input (1, B, D) = B sequences of length 1; evaluation input (B, D) = one
        # unbatched sequence of B tokens, so the block's samples attend to each other.
        out = self.fuse_encoder(tokens) if unbatched else self.fuse_encoder(tokens.unsqueeze(0)).squeeze(0)
        out = F.normalize(out, dim=1)
        return out[:, : self.image_dim], out[:, self.image_dim :]

    def _unimodal(self, x: torch.Tensor, encoder: nn.TransformerEncoder) -> torch.Tensor:
        # (B, 1, d): every sample its own length-1 sequence; nothing mixes samples.
        return F.normalize(encoder(x.unsqueeze(1)).squeeze(1), dim=1)

    # ------------------------------------------------------------------ training
    def forward(self, image: torch.Tensor, text: torch.Tensor) -> UCMFHOutput:
        """Training forward pass of B pairs (the official training path in both modes).

        Args:
            image: (B, d_img) image features.
            text: (B, d_txt) text features of the same pairs.
        """
        self._check(image, "image", self.image_dim)
        self._check(text, "text", self.text_dim)
        if image.shape[0] != text.shape[0]:
            raise ValueError(f"image has {image.shape[0]} rows but text has {text.shape[0]}; pass pairs")
        if self.fusion == "official_fused":
            f_img, f_txt = self._fused(image, text, unbatched=False)
        else:
            f_img, f_txt = self._unimodal(image, self.image_encoder), self._unimodal(text, self.text_encoder)
        return UCMFHOutput(f_img, f_txt, self.image_head(f_img), self.text_head(f_txt))

    # ------------------------------------------------------------------ inference
    def _require_unimodal(self, what: str) -> None:
        if self.fusion != "unimodal":
            raise ValueError(
                f"{what} needs fusion='unimodal': with fusion='official_fused' a code depends on the paired "
                "other modality (use encode_pairs, and label the results as fused)"
            )

    def _blocks(self, fn, *xs: torch.Tensor, batch_size: int) -> torch.Tensor:
        return torch.cat(
            [fn(*(x[s : s + batch_size] for x in xs)) for s in range(0, xs[0].shape[0], batch_size)]
        )

    @torch.no_grad()
    def encode_image(self, image: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
        """(N, d_img) image features -> (N, bits) continuous codes (unimodal mode; batching-independent)."""
        self._require_unimodal("encode_image")
        self._check(image, "image", self.image_dim)
        return self._blocks(
            lambda x: self.image_head(self._unimodal(x, self.image_encoder)), image, batch_size=batch_size
        )

    @torch.no_grad()
    def encode_text(self, text: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
        """(N, d_txt) text features -> (N, bits) continuous codes (unimodal mode)."""
        self._require_unimodal("encode_text")
        self._check(text, "text", self.text_dim)
        return self._blocks(
            lambda x: self.text_head(self._unimodal(x, self.text_encoder)), text, batch_size=batch_size
        )

    @torch.no_grad()
    def encode_pairs(self, image: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Continuous codes of N pairs the way the official evaluation computes them.

        ``official_fused``: blocks of ``eval_batch_size`` consecutive pairs through the fused encoder with
        the 2-D (unbatched) input, so codes depend on the paired modality and the block (the official
        loader also drops the last incomplete block; here it is encoded as a smaller block).
        ``unimodal``: the same as :meth:`encode_image` and :meth:`encode_text`.

        Returns:
            ``(image codes (N, bits), text codes (N, bits))``, continuous.
        """
        self._check(image, "image", self.image_dim)
        self._check(text, "text", self.text_dim)
        if image.shape[0] != text.shape[0]:
            raise ValueError(f"image has {image.shape[0]} rows but text has {text.shape[0]}; pass pairs")
        if self.fusion == "unimodal":
            return self.encode_image(image), self.encode_text(text)
        img, txt = [], []
        for s in range(0, image.shape[0], self.eval_batch_size):
            f_img, f_txt = self._fused(
                image[s : s + self.eval_batch_size], text[s : s + self.eval_batch_size], True
            )
            img.append(self.image_head(f_img))
            txt.append(self.text_head(f_txt))
        return torch.cat(img), torch.cat(txt)

    @staticmethod
    def codes(h: torch.Tensor) -> torch.Tensor:
        """Binary ±1 codes of continuous outputs (``sign`` with ``sign(0) = +1``)."""
        return binarize(h)

    def extra_repr(self) -> str:
        return f"bits={self.bits}, fusion={self.fusion!r}"
