"""The official SEPS / LAPS forward, computed from an official checkpoint's own state dict.

This is the yardstick of the importer (``patchword.imports.seps``, ``tests/imports/test_import_seps.py``): it
reads the ``model`` dict of ``model_best.pth`` under its official keys (``img_enc.*``, ``txt_enc.*``,
``cross_net.*``) and never a patchword model. Written from reference/seps_laps.md:

* ``lib/encoders.py``: the backbone's ``last_hidden_state`` (ViT with CLS first, Swin without) through
  ``vision_proj``; BERT with ``attention_mask = ids != 0`` through ``fc`` (``nn.Identity`` when the widths
  match). The backbones are built the official way (``ViTModel`` / ``SwinModel`` / ``BertModel`` with their
  pooling layers) and receive their tensors through transformers' own ``from_pretrained``, which also reads
  the key names of checkpoints written with transformers 4;
* ``lib/cross_net.py``: :func:`patchword.testing.seps_independent.independent_seps_scores`, which imports
  nothing from ``patchword`` and is handed the checkpoint's own ``opt`` values and ``cross_net.aggr_net``
  tensors: CLS by ``is_sqr(tokens)``, ``K = ceil(N * sparse_ratio)`` computed there from the N spatial
  tokens the backbone gives, ``N_c = int(opt.num_patches * aggr_ratio * sparse_ratio)`` checked against the
  aggregation MLP the checkpoint holds, the per-caption loop and the dense branch of SEPS. No library
  config (``SEPSConfig``) is involved.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from patchword.testing.seps_independent import SEPSOptions, independent_seps_scores

__all__ = ["OfficialSEPS", "OfficialTokenAggregation"]

#: Buffers a transformers 4 checkpoint holds that transformers 5 rebuilds (not parameters of the model).
_CONSTANT_BUFFERS = re.compile(r"(relative_position_index|position_ids|token_type_ids)$")


class OfficialTokenAggregation(nn.Module):
    """``lib/cross_net.py: TokenAggregation`` with its official parameter names and shapes."""

    def __init__(self, dim: int, keeped_patches: int, dim_ratio: float = 0.2) -> None:
        super().__init__()
        hidden = int(dim * dim_ratio)
        self.weight = nn.Sequential(
            nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, keeped_patches)
        )
        self.scale = nn.Parameter(torch.ones(1, 1, 1))


def _sub_state(state: dict[str, torch.Tensor], prefix: str, used: set[str]) -> dict[str, torch.Tensor]:
    out = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    used.update(prefix + k for k in out)
    return out


def _backbone(class_name: str, architecture: dict[str, Any], tensors: dict[str, torch.Tensor]):
    """A transformers backbone with its pooling layer (as the official code builds it), loaded with
    ``from_pretrained`` from ``tensors``; any missing, mis-shaped or unknown tensor is an error."""
    import transformers
    from safetensors.torch import save_file

    spec = dict(architecture)
    config = transformers.AutoConfig.for_model(spec.pop("model_type"), **spec)
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(Path(tmp) / "model.safetensors"))
        model, info = getattr(transformers, class_name).from_pretrained(tmp, output_loading_info=True)
    unexpected = [k for k in info["unexpected_keys"] if not _CONSTANT_BUFFERS.search(k)]
    problems = [*info["missing_keys"], *unexpected, *info["mismatched_keys"], *info["error_msgs"]]
    if problems:
        raise ValueError(
            f"the official {class_name} does not load these tensors: {sorted(map(str, problems))}"
        )
    return model.float().eval()


def _linear_or_identity(tensors: dict[str, torch.Tensor], in_dim: int, out_dim: int) -> nn.Module:
    """``vision_proj`` / ``fc``: ``nn.Identity`` when the widths match, else a loaded ``nn.Linear``."""
    if in_dim == out_dim:
        if tensors:
            raise ValueError(f"widths match ({in_dim}) but the checkpoint holds a projection")
        return nn.Identity()
    layer = nn.Linear(in_dim, out_dim)
    layer.load_state_dict(tensors, strict=True)
    return layer


class OfficialSEPS:
    """The official VSEModel's evaluation forward on an official state dict.

    Args:
        state: ``model_best.pth['model']`` (official keys).
        opt: its ``opt`` (``vit_type``, ``embed_size``, ``sparse_ratio``, ``aggr_ratio``).
        vision, text: the backbones' transformers config dicts (``model_type`` plus the architecture).
        dense: True for SEPS (a dense branch), False for LAPS.
    """

    def __init__(
        self,
        state: dict[str, torch.Tensor],
        opt: Any,
        vision: dict[str, Any],
        text: dict[str, Any],
        *,
        dense: bool,
    ) -> None:
        used: set[str] = set()
        self.opt, self.dense = opt, dense
        vision_class = "SwinModel" if "swin" in opt.vit_type else "ViTModel"
        self.visual = _backbone(vision_class, vision, _sub_state(state, "img_enc.visual_encoder.", used))
        self.bert = _backbone("BertModel", text, _sub_state(state, "txt_enc.bert.", used))
        embed = opt.embed_size
        self.vision_proj = _linear_or_identity(
            _sub_state(state, "img_enc.vision_proj.", used), self.visual.config.hidden_size, embed
        )
        self.fc = _linear_or_identity(
            _sub_state(state, "txt_enc.fc.", used), self.bert.config.hidden_size, embed
        )
        aggr = _sub_state(state, "cross_net.aggr_net.", used)
        self.aggr_net = OfficialTokenAggregation(embed, aggr["weight.3.weight"].shape[0])
        self.aggr_net.load_state_dict(aggr, strict=True)
        left = sorted(set(state) - used)
        if left:
            raise ValueError(f"tensors the official VSEModel does not have: {left}")

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) normalised pixels -> (B, L_v, C) tokens (``VisionTransEncoder.forward``)."""
        return self.vision_proj(self.visual(pixels).last_hidden_state)

    @torch.no_grad()
    def encode_texts(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, L) token ids, padding 0 -> (B, L, C) tokens (``EncoderText_BERT.forward``)."""
        return self.fc(self.bert(input_ids=ids, attention_mask=(ids != 0).float())[0])

    def scores(
        self,
        pixels: torch.Tensor,
        cap_ids: torch.Tensor,
        cap_lens: torch.Tensor,
        dense_ids: torch.Tensor | None = None,
        dense_lens: torch.Tensor | None = None,
        *,
        pairing: str = "caption",
        dense_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B_v, B_t) similarities of ``cross_net`` over the encoded inputs.

        Args:
            dense_ids, dense_lens: SEPS dense captions, one per image (B_v rows).
            pairing: ``"caption"`` (the official protocol: caption j uses dense row ``dense_index[j]``, its
                ground-truth image's) or ``"image"`` (each image with its own dense caption).
        """
        img = self.encode_images(pixels)
        opt = SEPSOptions(
            sparse_ratio=self.opt.sparse_ratio,
            aggr_ratio=self.opt.aggr_ratio,
            num_patches=getattr(self.opt, "num_patches", None),  # None: the N the backbone gives
        )
        weights = {f"aggr_net.{k}": v for k, v in self.aggr_net.state_dict().items()}
        dense = self.encode_texts(dense_ids) if self.dense and dense_ids is not None else None
        return independent_seps_scores(
            opt,
            weights,
            img,
            self.encode_texts(cap_ids),
            cap_lens,
            dense,
            dense_lens if dense is not None else None,
            dense_pairing=pairing,
            dense_index=dense_index if pairing == "caption" else None,
        )


# ------------------------------------------------------------------ official checkpoints of tiny models
# A checkpoint as the official train.py writes model_best.pth, over tiny random backbones: what the import
# tests and benchmarks/official_seps_checkpoint.py feed `patchword import`.

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(35))]
BERT = dict(
    vocab_size=len(VOCAB),
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=64,
)
VIT = dict(
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    image_size=32,
    patch_size=8,
)
SWIN = dict(
    image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 2], window_size=4, mlp_ratio=2.0
)
NUM_PATCHES = 16  # ViT: 4 x 4 patches of 8 px (+ CLS); Swin: 8 x 8 cells of 4 px merged once to 4 x 4


def write_tiny_backbones(root: str | Path) -> tuple[Path, Path]:
    """The tiny ``VIT`` / ``BERT`` backbones as ``save_pretrained`` writes them, in ``root/vit`` and
    ``root/bert`` (with BERT's ``vocab.txt`` of ``VOCAB``), seeded: the ``--hf-vision`` / ``--hf-text``
    directories an import of :func:`official_checkpoint` names. Returns ``(vit_dir, bert_dir)``."""
    import transformers

    root = Path(root)
    torch.manual_seed(0)
    vit = transformers.ViTModel(transformers.ViTConfig(**VIT), add_pooling_layer=False)
    vit.save_pretrained(root / "vit")
    transformers.BertModel(transformers.BertConfig(**BERT)).save_pretrained(root / "bert")
    (root / "bert" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return root / "vit", root / "bert"


def official_opt(**changes) -> argparse.Namespace:
    """Every field the official train.py saves: arguments.py's defaults, ``model_name`` (train.py) and
    ``num_patches`` (set by the official image encoder)."""
    opt = dict(
        data_path="data/", dataset="f30k", margin=0.2, num_epochs=30, batch_size=128, embed_size=512,
        grad_clip=2.0, learning_rate=2e-4, workers=8, log_step=200, val_step=500, logger_name="runs/test",
        max_violation=False, vse_mean_warmup_epochs=1, embedding_warmup_epochs=0,
        f30k_img_path="/home/fzr/data/flickr30k-images", coco_img_path="/home/fzr/data/coco/", img_res=224,
        vit_type="vit", multi_gpu=0, world_size=1, rank=0, local_rank=0, dist_backend="nccl",
        dist_url="env://", seed=0, size_augment=1, loss="vse", eval=1, save_results=1, evaluate_cxc=0,
        gpu_id=0, bert_path="../weights_models/bert-base-uncased", lr_schedules=[9, 15, 20, 25],
        decay_rate=0.3, shard_size=256, max_word=90, aggr_ratio=0.4, sparse_ratio=0.5, attention_weight=0.8,
        ratio_weight=2.0, model_name="runs/test", num_patches=196,
    )  # fmt: skip
    opt.update(changes)
    return argparse.Namespace(**opt)


# transformers 5 key names -> the transformers 4 names official checkpoints carry (written out here by hand,
# independently of the importer's table; the official forward reads them through from_pretrained).
_TO_V4 = {
    "vit": [
        (r"^layers\.(\d+)\.", r"encoder.layer.\1."),
        (r"attention\.q_proj\.", "attention.attention.query."),
        (r"attention\.k_proj\.", "attention.attention.key."),
        (r"attention\.v_proj\.", "attention.attention.value."),
        (r"attention\.o_proj\.", "attention.output.dense."),
        (r"mlp\.fc1\.", "intermediate.dense."),
        (r"mlp\.fc2\.", "output.dense."),
    ],
    "swin": [
        (r"attention\.q_proj\.", "attention.self.query."),
        (r"attention\.k_proj\.", "attention.self.key."),
        (r"attention\.v_proj\.", "attention.self.value."),
        (r"attention\.relative_position_bias\.", "attention.self."),
        (r"attention\.o_proj\.", "attention.output.dense."),
        (r"mlp\.fc1\.", "intermediate.dense."),
        (r"mlp\.fc2\.", "output.dense."),
    ],
}


def _v4_names(state: dict[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        for source, target in _TO_V4[kind]:
            key = re.sub(source, target, key)
        out[key] = value
    return out


def _moved(module: torch.nn.Module, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The module's state with noise added to every floating tensor (nothing left at its initial value)."""
    return {
        k: v + 0.05 * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v.clone()
        for k, v in module.state_dict().items()
    }


def official_checkpoint(
    kind: str, *, embed: int, seed: int = 0, v4: bool = True, sparse=0.5, aggr=0.4, **opt_changes
) -> dict:
    """``model_best.pth`` of the official VSEModel over tiny random backbones (``kind``: vit or swin)."""
    from patchword.hub import require_transformers

    transformers = require_transformers()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if kind == "vit":  # ViTModel.from_pretrained keeps its pooling layer
        visual = transformers.ViTModel(transformers.ViTConfig(**VIT))
    else:
        visual = transformers.SwinModel(transformers.SwinConfig(**SWIN))
    bert = transformers.BertModel(transformers.BertConfig(**BERT))
    state = {}
    vis = _moved(visual, gen)
    if v4:
        vis = _v4_names(vis, kind)
        for name, buffer in visual.named_buffers():
            if name.endswith("relative_position_index"):  # a persistent buffer in transformers 4
                side = int(buffer.numel() ** 0.5)
                vis[_v4_names({name: buffer}, kind).popitem()[0]] = buffer.reshape(side, side).clone()
    state.update({f"img_enc.visual_encoder.{k}": v for k, v in vis.items()})
    hidden = visual.config.hidden_size
    if embed != hidden:
        state.update(
            {f"img_enc.vision_proj.{k}": v for k, v in _moved(torch.nn.Linear(hidden, embed), gen).items()}
        )
    state.update({f"txt_enc.bert.{k}": v for k, v in _moved(bert, gen).items()})
    if v4:  # persistent in the transformers 4 releases before 4.31
        state["txt_enc.bert.embeddings.position_ids"] = torch.arange(BERT["max_position_embeddings"])[None]
    if embed != BERT["hidden_size"]:
        state.update({f"txt_enc.fc.{k}": v for k, v in _moved(torch.nn.Linear(16, embed), gen).items()})
    aggregation = OfficialTokenAggregation(embed, int(NUM_PATCHES * aggr * sparse))
    state.update({f"cross_net.aggr_net.{k}": v for k, v in _moved(aggregation, gen).items()})
    opt = official_opt(
        vit_type=kind, img_res=32, embed_size=embed, sparse_ratio=sparse, aggr_ratio=aggr,
        num_patches=NUM_PATCHES, **opt_changes,
    )  # fmt: skip
    return {"model": state, "opt": opt, "epoch": 12, "best_rsum": 512.5, "Eiters": 4242}
