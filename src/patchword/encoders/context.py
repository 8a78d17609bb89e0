"""A transformer over encoder tokens (TGDT's region and text transformers) and a text-encoder wrapper.

TGDT (reference/tgdt_ucmfh.md A.3) puts transformer encoders on top of the projected region features and
on top of the text backbone's word features; the output at position 0 is the global embedding, the rest
are the local tokens. The official layers are PyTorch's post-norm ``TransformerEncoderLayer`` (d = 1024,
4 heads, FFN 2048, dropout 0.1, ReLU). On the image side the official collate function puts a zero
feature vector at position 0 as the "CLS" slot; here that slot is a learned token (``global_token``),
which is what a zero vector becomes after the official feature MLP and projection: a constant.

Unlike the official stage-2 transformers, padding is masked (the official ones have no key-padding
mask, so a caption's embedding depends on the padding of its evaluation batch; reference A.10 item 4).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain

import torch
from torch import nn

from patchword.encoders.base import EncoderBase, padding_mask

__all__ = ["ContextConfig", "ContextTransformer", "ContextualTextEncoder", "post_norm_layers"]


@dataclass
class ContextConfig:
    """Hyper-parameters of :class:`ContextTransformer`; ``layers=0`` means no transformer."""

    layers: int = 0  # transformer layers (TGDT: 4 = 2 stage-1 + 2 stage-2 in the 1024-d part)
    heads: int = 4  # attention heads; must divide the token width
    ffn_dim: int = 2048  # feed-forward hidden size (official 2048)
    dropout: float = 0.1  # dropout inside every layer (official 0.1)
    global_token: bool = False  # prepend a learned token whose output is the global embedding
    # also return the tokens after the first half of the layers (TGDT's stage 1) as C trailing channels:
    # (B, L, 2C) = [final, stage 1], for the official test-time local similarity (model.tgdt.local_tokens)
    emit_stage1: bool = False


def post_norm_layers(width: int, layers: int, heads: int, ffn_dim: int, dropout: float) -> nn.ModuleList:
    """``layers`` PyTorch post-norm ``TransformerEncoderLayer`` s (ReLU, batch first): the official TGDT /
    TERAN layers, under the official parameter names (``self_attn.in_proj_weight``, ``linear1``...)."""
    if layers < 0:
        raise ValueError(f"layers must be >= 0, got {layers}")
    if layers and width % heads:
        raise ValueError(f"heads ({heads}) must divide the token width ({width})")
    return nn.ModuleList(
        nn.TransformerEncoderLayer(
            d_model=width,
            nhead=heads,
            dim_feedforward=ffn_dim,
            dropout=dropout,
            activation="relu",
            batch_first=True,
        )
        for _ in range(layers)
    )


class ContextTransformer(nn.Module):
    """Post-norm transformer layers over (B, L, C) tokens, optionally with a learned global token first.

    Args:
        width: token width C.
        cfg: hyper-parameters.
    """

    def __init__(self, width: int, cfg: ContextConfig) -> None:
        super().__init__()
        if cfg.emit_stage1 and (cfg.layers < 2 or cfg.layers % 2):
            raise ValueError(f"emit_stage1 needs an even number of layers (two stages), got {cfg.layers}")
        self.cfg = cfg
        self.layers = post_norm_layers(width, cfg.layers, cfg.heads, cfg.ffn_dim, cfg.dropout)
        self.global_token = nn.Parameter(torch.zeros(1, 1, width)) if cfg.global_token else None
        if self.global_token is not None:
            nn.init.trunc_normal_(self.global_token, std=0.02)

    def forward(self, tokens: torch.Tensor, lens: torch.Tensor | None = None) -> torch.Tensor:
        """(B, L, C) tokens and optional (B,) valid lengths -> (B, L', C), L' = L + 1 with a global token
        ((B, L', 2C) with ``emit_stage1``: the final tokens, then those after the first half of the layers).

        Positions at or beyond ``lens`` are excluded from attention (their outputs are meaningless).
        """
        if self.global_token is not None:
            # expanded from (1, C) so its gradient is laid out as the parameter (see TinyViT's CLS row)
            glob = self.global_token.view(1, -1).expand(tokens.shape[0], 1, -1)
            tokens = torch.cat([glob.to(tokens.dtype), tokens], 1)
            if lens is not None:
                lens = lens + 1
        mask = (
            None if lens is None else padding_mask(lens.to(tokens.device, non_blocking=True), tokens.shape[1])
        )
        stage1, half = None, len(self.layers) // 2
        for depth, layer in enumerate(self.layers, start=1):
            tokens = layer(tokens, src_key_padding_mask=mask)
            if self.cfg.emit_stage1 and depth == half:
                stage1 = tokens
        return tokens if stage1 is None else torch.cat([tokens, stage1], dim=-1)


class ContextualTextEncoder(EncoderBase):
    """A text encoder followed by a :class:`ContextTransformer` (TGDT's text transformer).

    The transformer trains at the head learning rate: it joins the base encoder's head parameters, so a
    pretrained backbone (BERT) keeps its reduced rate.
    """

    def __init__(self, base: EncoderBase, context: ContextTransformer) -> None:
        super().__init__()
        self.base = base
        self.context = context
        self.embed_dim = base.embed_dim
        self.pretrained = base.pretrained
        self.max_len, self.vocab_size = base.max_len, base.vocab_size
        self.register_load_state_dict_pre_hook(_drop_projection_alias)

    @property
    def proj(self) -> nn.Module:  # type: ignore[override]
        """The base encoder's projection, read through: registering it here too would put one Linear in
        the state dict under two names, which safetensors refuses to save (shared tensors)."""
        return self.base.proj

    def head_parameters(self) -> Iterator[nn.Parameter]:
        return chain(self.base.head_parameters(), self.context.parameters())

    def forward(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """(B, L) ids, (B,) lengths -> (B, L, embed_dim) contextualised tokens."""
        return self.context(self.base(ids, lens), lens.to(ids.device, non_blocking=True))


def _drop_projection_alias(
    module: nn.Module,
    state_dict: dict[str, torch.Tensor],
    prefix: str,
    local_metadata: dict,
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    """Load-time pre-hook of :class:`ContextualTextEncoder`: weights saved before its projection became a
    read-through property hold it twice, as ``{prefix}base.proj.*`` and ``{prefix}proj.*`` (one module
    under two names, so equal values). The alias is dropped when it equals the base key, renamed to it when
    the base key is absent; an alias that differs from its base key is an error naming both."""
    alias, base = prefix + "proj.", prefix + "base.proj."
    for key in [k for k in state_dict if k.startswith(alias)]:
        target = base + key[len(alias) :]
        value = state_dict.pop(key)
        if target not in state_dict:
            state_dict[target] = value
        elif not torch.equal(torch.as_tensor(state_dict[target]), torch.as_tensor(value)):
            error_msgs.append(
                f"{key} differs from {target}: weights saved by an earlier patchword hold the one text "
                "projection under both names, with equal values"
            )
