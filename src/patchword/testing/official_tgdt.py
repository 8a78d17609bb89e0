"""The official TGDT forward (LCFractal/TGDT ``models/baseline.py``, built on TERAN), computed from a
checkpoint's own tensors under their official names; the yardstick of the TGDT importer's tests.

Written from reference/tgdt_ucmfh.md A.2-A.4 and the official modules' structure, literally and slowly:

* images: the collate function's zero feature at position 0 (the "CLS" slot, with a zero box), TERAN's
  bottom-up post-processing (``TransformerPostProcessing`` without its unused ``fc``: the box encoding of
  ``image-model.pos-encoding`` on ``[x1, y1, x2, y2, area]``, then ``image-model.transformer-layers``
  feat-dim layers; the identity for ``0`` / ``null``), ``img_proj``, stage 1 (``transformer_encoder_2``,
  or ``transformer_encoder_1`` with
  ``shared-transformer``), stage 2 (``transformer_encoder_img``); the global embedding is stage 2's output
  at position 0;
* captions: BERT truncated to ``extraction-hidden-layer`` layers (its last hidden state), ``cap_proj``,
  stage 1 (``transformer_encoder_1``, padding masked), stage 2 (``transformer_encoder_text``, **no**
  padding mask, as official); the global embedding is position 0 (``text-aggregation: first``) or the sum
  over the valid positions (``sum``);
* the local tokens are stage 2's outputs in training (``istest=False``) and stage 1's at test time
  (``switch_test()``), L2-normalised, position 0 overwritten by the global embedding;
* the local similarity is ``AlignmentContrastiveLoss``'s matrix: regions from position 1, words
  ``[1:-2]``, padding filled with 0, max over regions, sum over words, times 10.

Transformer layers are PyTorch's post-norm ``TransformerEncoderLayer`` (ReLU, 4 heads as hard-coded
officially), written out here from the tensors (:func:`transformer_layer`) rather than through
``nn.TransformerEncoder``; BERT is transformers' ``BertModel``, as the official code uses it.

:func:`official_tgdt_state_dict` makes random weights in the official key layout (what
``BASELINE(config).state_dict()`` holds) for tests that need an official checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "OFFICIAL_HEADS",
    "OfficialTGDTEmbeddings",
    "official_tgdt_embeddings",
    "official_tgdt_scores",
    "official_tgdt_state_dict",
    "official_alignment",
    "transformer_layer",
    "transformer_stack",
]

#: ``nhead`` of every official TGDT transformer (hard-coded in ``models/baseline.py``).
OFFICIAL_HEADS = 4
_P = "img_txt_enc."


# --------------------------------------------------------------------------------------------- layers
def transformer_layer(
    x: torch.Tensor,
    state: dict[str, torch.Tensor],
    prefix: str,
    nhead: int,
    pad: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """One post-norm ``nn.TransformerEncoderLayer`` (ReLU, eval mode) from its tensors under ``prefix``.

    Args:
        x: (B, L, C) tokens (batch first; the official modules are sequence first, same arithmetic).
        state: tensors named ``prefix + "self_attn.in_proj_weight"``, ``prefix + "linear1.weight"``...
        nhead: attention heads.
        pad: (B, L) bool, True at keys to ignore (``src_key_padding_mask``), or None.
    """
    b, n, c = x.shape
    q, k, v = F.linear(
        x, state[prefix + "self_attn.in_proj_weight"], state[prefix + "self_attn.in_proj_bias"]
    ).chunk(3, dim=-1)
    q, k, v = (t.reshape(b, n, nhead, c // nhead).transpose(1, 2) for t in (q, k, v))
    logits = q @ k.transpose(-1, -2) / math.sqrt(c // nhead)
    if pad is not None:
        logits = logits.masked_fill(pad[:, None, None, :], float("-inf"))
    ctx = (logits.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c)
    attn = F.linear(
        ctx, state[prefix + "self_attn.out_proj.weight"], state[prefix + "self_attn.out_proj.bias"]
    )
    x = F.layer_norm(x + attn, (c,), state[prefix + "norm1.weight"], state[prefix + "norm1.bias"], eps)
    hidden = F.relu(F.linear(x, state[prefix + "linear1.weight"], state[prefix + "linear1.bias"]))
    ff = F.linear(hidden, state[prefix + "linear2.weight"], state[prefix + "linear2.bias"])
    return F.layer_norm(x + ff, (c,), state[prefix + "norm2.weight"], state[prefix + "norm2.bias"], eps)


def transformer_stack(
    x: torch.Tensor, state: dict[str, torch.Tensor], prefix: str, nhead: int, pad: torch.Tensor | None = None
) -> torch.Tensor:
    """An ``nn.TransformerEncoder`` without final norm: its layers ``prefix + "layers.{i}."`` in order."""
    depth = len({k[len(prefix) :].split(".")[1] for k in state if k.startswith(prefix + "layers.")})
    for i in range(depth):
        x = transformer_layer(x, state, f"{prefix}layers.{i}.", nhead, pad)
    return x


def _linear(x: torch.Tensor, state: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    return F.linear(x, state[prefix + ".weight"], state[prefix + ".bias"])


# --------------------------------------------------------------------------------------------- forward
@dataclass
class OfficialTGDTEmbeddings:
    """What ``JointTextImageTransformerEncoder.forward`` returns, batch first.

    Attributes:
        img_global: (B_v, C) unit global image embeddings.
        img_tokens: (B_v, 1 + R, C) unit local tokens, position 0 = ``img_global``.
        txt_global: (B_t, C) unit global caption embeddings.
        txt_tokens: (B_t, L, C) unit local tokens, position 0 = ``txt_global``.
        txt_lens: (B_t,) caption lengths ([CLS] and [SEP] included).
    """

    img_global: torch.Tensor
    img_tokens: torch.Tensor
    txt_global: torch.Tensor
    txt_tokens: torch.Tensor
    txt_lens: torch.Tensor


def _check_supported(config: dict[str, Any]) -> None:
    if config["model"]["image-aggregation"] != "first":
        raise NotImplementedError("image-aggregation other than 'first'")
    if config["image-model"].get("pos-encoding") not in (None, "concat-and-process", "project-and-sum"):
        raise NotImplementedError(f"pos-encoding {config['image-model']['pos-encoding']!r}")


def _post_processing(
    feats: torch.Tensor, boxes: torch.Tensor | None, state: dict[str, torch.Tensor], config: dict[str, Any]
) -> torch.Tensor:
    """``TransformerPostProcessing`` before its ``fc``: box encoding, then the feat-dim transformer.

    Args:
        feats: (B, 1 + R, feat-dim) with the zero CLS slot; ``boxes`` (B, 1 + R, 4) with a zero box there.
    """
    mode = config["image-model"].get("pos-encoding")
    if mode is not None:
        if boxes is None:
            raise ValueError(f"pos-encoding {mode!r} needs the regions' boxes")
        area = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
        info = torch.cat([boxes, area[..., None]], dim=-1)  # [x1, y1, x2, y2, area]
        prefix = _P + "img_enc.pos_encoding_image.map"
        if mode == "concat-and-process":  # Linear(D + 5, D) -> ReLU -> Linear(D, D)
            hidden = F.relu(_linear(torch.cat([feats, info], dim=-1), state, prefix + ".0"))
            feats = _linear(hidden, state, prefix + ".2")
        else:  # project-and-sum: Linear(5, D) added to every region
            feats = feats + _linear(info, state, prefix)
    if config["image-model"].get("transformer-layers", 0):
        feats = transformer_stack(feats, state, _P + "img_enc.transformer_encoder.", OFFICIAL_HEADS)
    return feats


@torch.no_grad()
def official_tgdt_embeddings(
    state: dict[str, torch.Tensor],
    config: dict[str, Any],
    bert_config: Any,
    regions: torch.Tensor,
    ids: torch.Tensor,
    lens: torch.Tensor,
    *,
    boxes: torch.Tensor | None = None,
    istest: bool = False,
) -> OfficialTGDTEmbeddings:
    """The official embeddings of a batch of images and a batch of captions (eval mode).

    Args:
        state: the checkpoint's ``model`` state dict (official names).
        config: the checkpoint's ``config`` (the official YAML as a dict).
        bert_config: the ``transformers.BertConfig`` of the checkpoint's BERT (``num_hidden_layers`` =
            ``extraction-hidden-layer``).
        regions: (B_v, R, feat-dim) region features (without the CLS slot: it is added here, as the
            official collate function does).
        ids: (B_t, L) BERT token ids, 0-padded; ``lens`` (B_t,) their lengths.
        boxes: (B_v, R, 4) normalised region boxes (needed with ``image-model.pos-encoding``); the CLS
            slot gets a zero box, as the official collate function pads it.
        istest: after ``switch_test()``: local tokens from stage 1 instead of stage 2.
    """
    from transformers import BertModel

    _check_supported(config)
    mcfg = config["model"]
    stage1_img = "transformer_encoder_1" if mcfg.get("shared-transformer") else "transformer_encoder_2"
    # images: zero CLS slot (zero box), post-processing, projection, stage 1 (no padding: R fixed), stage 2
    feats = torch.cat([regions.new_zeros(regions.shape[0], 1, regions.shape[2]), regions], dim=1)
    if boxes is not None:
        boxes = torch.cat([boxes.new_zeros(boxes.shape[0], 1, 4), boxes], dim=1)
    feats = _post_processing(feats, boxes, state, config)
    x = _linear(feats, state, _P + "img_proj")
    s1 = transformer_stack(x, state, f"{_P}{stage1_img}.", OFFICIAL_HEADS)
    s2 = transformer_stack(s1, state, _P + "transformer_encoder_img.", OFFICIAL_HEADS)
    img_global = F.normalize(s2[:, 0], dim=-1)
    img_tokens = F.normalize(s1 if istest else s2, dim=-1).clone()
    img_tokens[:, 0] = img_global

    # captions: BERT (truncated), projection, stage 1 with the padding mask, stage 2 without
    bert = BertModel(bert_config).eval()
    prefix = _P + "txt_enc.bert_model."
    bert.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}, strict=True)
    valid = torch.arange(ids.shape[1])[None] < lens[:, None]
    hidden = bert(ids, attention_mask=valid.long(), output_hidden_states=True).hidden_states[-1]
    c = _linear(hidden, state, _P + "cap_proj")
    t1 = transformer_stack(c, state, _P + "transformer_encoder_1.", OFFICIAL_HEADS, pad=~valid)
    t2 = transformer_stack(t1, state, _P + "transformer_encoder_text.", OFFICIAL_HEADS)
    aggregation = mcfg["text-aggregation"]
    if aggregation == "first":
        txt_global = F.normalize(t2[:, 0], dim=-1)
    elif aggregation == "sum":
        txt_global = F.normalize((t2 * valid[..., None]).sum(1), dim=-1)
    else:
        raise NotImplementedError(f"text-aggregation {aggregation!r}")
    txt_tokens = F.normalize(t1 if istest else t2, dim=-1).clone()
    txt_tokens[:, 0] = txt_global
    return OfficialTGDTEmbeddings(img_global, img_tokens, txt_global, txt_tokens, lens)


def official_alignment(
    img_tokens: torch.Tensor, txt_tokens: torch.Tensor, txt_lens: torch.Tensor
) -> torch.Tensor:
    """``AlignmentContrastiveLoss(return_similarity_mat=True)``: (B_v, 1 + R, C), (B_t, L, C) -> (B_v, B_t).

    The images have no padding (every image has R regions, as the official 36-region features).
    """
    regions = img_tokens[:, 1:]
    words = txt_tokens[:, 1:-2]  # drop [CLS] and the last two positions of the padded batch
    word_lens = txt_lens - 3
    align = torch.einsum("vrc,twc->vtrw", regions, words)
    pad = torch.arange(words.shape[1])[None] >= word_lens[:, None]  # (B_t, W)
    align = align.masked_fill(pad[None, :, None, :], 0.0)
    return align.max(dim=2).values.sum(dim=2) * 10


@torch.no_grad()
def official_tgdt_scores(
    state: dict[str, torch.Tensor],
    config: dict[str, Any],
    bert_config: Any,
    regions: torch.Tensor,
    captions: list[torch.Tensor],
    *,
    boxes: torch.Tensor | None = None,
    istest: bool = False,
) -> dict[str, torch.Tensor]:
    """Global, local and hybrid (``d_g + d_l``, the two-stage re-ranking score) similarities, (B_v, B_t) each.

    Every caption is its own batch: the official stage-2 text transformer has no padding mask, so in a
    padded batch a caption's embedding depends on its neighbours' lengths (reference A.10 item 4); one
    caption at a time is the official forward without that artefact.

    Args:
        captions: B_t 1-D tensors of BERT ids ([CLS] ... [SEP]), at least 4 long.
        boxes: (B_v, R, 4) normalised region boxes (with ``image-model.pos-encoding``).
    """
    globals_, columns = [], []
    img = None
    for ids in captions:
        emb = official_tgdt_embeddings(
            state,
            config,
            bert_config,
            regions,
            ids[None],
            torch.tensor([len(ids)]),
            boxes=boxes,
            istest=istest,
        )
        img = emb
        globals_.append(emb.txt_global)
        columns.append(official_alignment(emb.img_tokens, emb.txt_tokens, emb.txt_lens))
    assert img is not None, "no captions"
    glob = img.img_global @ torch.cat(globals_).T
    local = torch.cat(columns, dim=1)
    return {"global": glob, "local": local, "hybrid": glob + local}


# --------------------------------------------------------------------------------------------- weights
def _add_linear(shapes: dict[str, tuple[int, ...]], prefix: str, d_in: int, d_out: int) -> None:
    shapes[prefix + ".weight"] = (d_out, d_in)
    shapes[prefix + ".bias"] = (d_out,)


def _add_encoder(shapes: dict[str, tuple[int, ...]], prefix: str, layers: int, width: int, ffn: int) -> None:
    for i in range(layers):
        p = f"{prefix}.layers.{i}."
        shapes[p + "self_attn.in_proj_weight"] = (3 * width, width)
        shapes[p + "self_attn.in_proj_bias"] = (3 * width,)
        _add_linear(shapes, p + "self_attn.out_proj", width, width)
        _add_linear(shapes, p + "linear1", width, ffn)
        _add_linear(shapes, p + "linear2", ffn, width)
        for norm in ("norm1", "norm2"):
            shapes[f"{p}{norm}.weight"] = (width,)
            shapes[f"{p}{norm}.bias"] = (width,)


def _random(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    noise = torch.randn(shape, generator=gen)
    if name.endswith(".weight") and len(shape) == 1:  # a LayerNorm scale: around 1
        return 1.0 + 0.2 * noise
    if len(shape) == 1:
        return 0.2 * noise
    return noise / math.sqrt(shape[-1])


def official_tgdt_state_dict(
    config: dict[str, Any], bert_config: Any, *, seed: int = 0, ffn_dim: int = 2048
) -> dict[str, torch.Tensor]:
    """Random weights in the key layout of ``BASELINE(config).state_dict()`` (the checkpoint's ``model``).

    Every tensor is off its initialisation (random values; LayerNorm scales around 1, biases non-zero), so a
    tensor mapped to the wrong place changes the scores. The BERT tensors are transformers' ``BertModel``
    (with its pooler, as official) perturbed; ``txt_enc.word_embeddings`` is the same tensor as BERT's word
    embeddings (the official module holds one embedding under two names).
    """
    from transformers import BertModel

    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        bert = BertModel(bert_config).state_dict()
    state = {
        f"{_P}txt_enc.bert_model.{k}": v + 0.05 * torch.randn(v.shape, generator=gen)
        if v.is_floating_point()
        else v
        for k, v in bert.items()
    }
    state[_P + "txt_enc.word_embeddings.weight"] = state[
        _P + "txt_enc.bert_model.embeddings.word_embeddings.weight"
    ]
    mcfg, tcfg, icfg = config["model"], config["text-model"], config["image-model"]
    embed, word, feat, layers = mcfg["embed-size"], tcfg["word-dim"], icfg["feat-dim"], mcfg["layers"]
    shapes: dict[str, tuple[int, ...]] = {}
    _add_linear(shapes, _P + "txt_enc.map", word, embed)
    if tcfg.get("layers", 0):
        _add_encoder(shapes, _P + "txt_enc.transformer_encoder", tcfg["layers"], word, 2048)
    if icfg.get("transformer-layers", 0):
        _add_encoder(shapes, _P + "img_enc.transformer_encoder", icfg["transformer-layers"], feat, 2048)
    if icfg.get("pos-encoding") == "concat-and-process":
        _add_linear(shapes, _P + "img_enc.pos_encoding_image.map.0", feat + 5, feat)
        _add_linear(shapes, _P + "img_enc.pos_encoding_image.map.2", feat, feat)
    elif icfg.get("pos-encoding") == "project-and-sum":
        _add_linear(shapes, _P + "img_enc.pos_encoding_image.map", 5, feat)
    _add_linear(shapes, _P + "img_enc.fc", feat, embed)
    _add_linear(shapes, _P + "img_proj", feat, embed)
    _add_linear(shapes, _P + "cap_proj", word, embed)
    _add_encoder(shapes, _P + "transformer_encoder_1", layers, embed, ffn_dim)
    if not mcfg.get("shared-transformer"):
        _add_encoder(shapes, _P + "transformer_encoder_2", layers, embed, ffn_dim)
    for name in ("text_agg_emb", "img_agg_emb"):
        _add_linear(shapes, f"{_P}{name}.0", embed, embed)
        _add_linear(shapes, f"{_P}{name}.2", embed, embed // 2)
        _add_linear(shapes, f"{_P}{name}.4", embed // 2, embed)
    _add_encoder(shapes, _P + "transformer_encoder_text", layers, embed, ffn_dim)
    _add_encoder(shapes, _P + "transformer_encoder_img", layers, embed, ffn_dim)
    _add_linear(shapes, "img_first_emb", embed, embed)
    _add_linear(shapes, "cap_first_emb", embed, embed)
    state.update({name: _random(name, shape, gen) for name, shape in shapes.items()})
    return state
