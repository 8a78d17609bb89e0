"""Importer of the official TGDT checkpoints (LCFractal/TGDT ``train.py``: ``model_best_rsum.pth.tar``).

A checkpoint holds ``model`` (the ``BASELINE`` state dict, TERAN's parameter names), ``config`` (the YAML
the run trained with), ``opt`` (its ``argparse.Namespace``), ``optimizer``, ``scheduler``, ``epoch`` and
``Eiters``. It becomes a retrieval run with ``model.matcher=tgdt``, the region encoder
``model.image_encoder=precomp`` and BERT with a text transformer (see reference/tgdt_ucmfh.md A.3-A.4):

==========================================================  ================================================
official (``model``)                                        patchword
==========================================================  ================================================
``img_txt_enc.img_proj``                                    ``image_encoder.proj``
``img_txt_enc.img_proj.bias``                               ``image_encoder.context.global_token`` (below)
``img_txt_enc.transformer_encoder_2.layers.i``              ``image_encoder.context.layers.i``
  (``transformer_encoder_1`` with ``shared-transformer``)
``img_txt_enc.transformer_encoder_img.layers.i``            ``image_encoder.context.layers.(L + i)``
``img_txt_enc.img_enc.pos_encoding_image.map``              ``image_encoder.post.box_map``
``img_txt_enc.img_enc.transformer_encoder.layers.i``        ``image_encoder.post.layers.i``
``img_txt_enc.txt_enc.bert_model.*``                        ``text_encoder.base.backbone.*``
``img_txt_enc.cap_proj``                                    ``text_encoder.base.proj``
``img_txt_enc.transformer_encoder_1.layers.i``              ``text_encoder.context.layers.i``
``img_txt_enc.transformer_encoder_text.layers.i``           ``text_encoder.context.layers.(L + i)``
==========================================================  ================================================

``L`` is ``model.layers`` (each stage's depth): patchword's context transformers run stage 1 and then
stage 2 as one stack of ``2 L`` layers. The official collate function puts a zero feature (with a zero box)
at position 0 as the image's CLS slot. The released configs (``image-model.transformer-layers: 4``,
``pos-encoding: concat-and-process``) run TERAN's post-processing on the 2048-d regions before
``img_proj``: it becomes ``model.precomp.post`` (box MLP + region transformer) and the zero slot goes through
it, as officially; the boxes are read from ``{split}_boxes.npy`` beside the features
(``data.region_boxes=true``: TERAN's ``bu_box`` divided by the image width and height). Without that stage
(``transformer-layers: 0``, ``pos-encoding: null``) the zero slot becomes ``img_proj.bias`` through the
projection, which is then the global token patchword prepends after its projection.

Not loaded, with the reason in ``import.json``: BERT's pooler and ``position_ids`` buffer, the alias
``txt_enc.word_embeddings``, ``txt_enc.map`` and ``img_enc.fc`` (outputs the aggregations replace),
``text_agg_emb`` / ``img_agg_emb`` / ``img_first_emb`` / ``cap_first_emb`` (defined, never called), the
optimizer and scheduler states.

What patchword cannot represent is refused, naming the ``config`` key (reference A.3):

* ``image-model.pos-encoding`` other than ``null``, ``concat-and-process`` or ``project-and-sum``;
* ``text-model.layers`` > 0 (a transformer on BERT's output before ``cap_proj``), ``text-model.name`` other
  than ``bert``, pre-extracted text or image features, ``exclude-stopwords``, ``measure: order``, and
  aggregations other than ``first`` (image) / ``first`` or ``sum`` (caption).

Local tokens as officially: the imported run's context transformers hand over stage 1's tokens too
(``emit_stage1``) and ``model.tgdt.local_tokens=stage1`` computes the evaluation's local similarity on them,
as the official test-time forward (``switch_test()``); in training mode it reads the final tokens, as the
official training forward. One official behaviour the imported model does not share (reference A.10): the
stage-2 transformers mask the padding (officially unmasked, so a caption's embedding depends on its batch).
So the imported scores are those of the official forward on each caption alone, in training and test mode
(tests/imports/test_import_tgdt_ucmfh.py).

The mapped ``config`` keys: ``model.embed-size`` / ``layers`` / ``dropout`` / ``shared-transformer`` /
``text-aggregation``, ``image-model.feat-dim`` / ``transformer-layers`` / ``pos-encoding`` / ``dropout``,
``text-model.extraction-hidden-layer`` (BERT's depth) and
``word-dim`` (checked against ``--hf-text``), ``training.loss-type`` (``model.tgdt.inference``: local,
global, or the two-stage hybrid of ``test_gl.py`` for ``alignment+matching``), ``dataset.name``
(``eval.coco_1k``; import.json's ``dataset``) and the training-only ``lr``, ``bs``, ``margin``,
``grad-clip``, ``max-violation``, ``scheduler`` / ``step-size`` / ``gamma``, ``text-model.fine-tune``,
``opt.num_epochs``. The official
constants become ``model.tgdt``: local scale 10, words ``[1:-2]`` (skip 1 head, 2 tail), ``d_g + d_l``,
shortlists 50 / 100; 4 heads.

Over 400 lines: one official format: the key map of TGDT's checkpoints, its opt and the region-encoder
conversion belong together.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import torch

from patchword.errors import ConfigError, DataError
from patchword.imports.base import (
    ImportOptions,
    ImportPlan,
    bert_vocab_file,
    hf_architecture,
    opt_dict,
    register_family,
)
from patchword.runs.files import BERT_VOCAB_FILE

__all__ = ["FAMILY", "detect", "convert"]

_logger = logging.getLogger(__name__)

FAMILY = "tgdt"
_P = "img_txt_enc."
_HEADS = 4  # nhead of every official TGDT transformer (hard-coded in models/baseline.py)
_MAX_CAPTION_TOKENS = 88  # the official evaluation buffers hold captions of up to 88 tokens
_LAYER = re.compile(r"layers\.(\d+)\.(.+)$")
_BOX_ENCODINGS = (None, "concat-and-process", "project-and-sum")  # image-model.pos-encoding
_POST = _P + "img_enc.transformer_encoder"  # TERAN's region transformer (image-model.transformer-layers)
#: ``config.dataset.name`` -> the dataset recorded in import.json (the released configs' two; another: None)
_DATASETS = {"f30k": "f30k", "coco": "coco"}

# Tensors of the official model that TGDT never uses, by prefix (after img_txt_enc. where it applies).
_UNUSED = {
    _P + "txt_enc.bert_model.pooler.": "BERT's pooler: TGDT reads the last hidden state, not the pooled one",
    _P + "txt_enc.word_embeddings.": "alias of txt_enc.bert_model.embeddings.word_embeddings (loaded there)",
    _P + "txt_enc.map.": "EncoderTextBERT.map: its output is replaced by the text aggregation",
    _P + "img_enc.fc.": "TransformerPostProcessing.fc: its output is replaced by the image aggregation",
    _P + "text_agg_emb.": "defined but never called by the official forward",
    _P + "img_agg_emb.": "defined but never called by the official forward",
    "img_first_emb.": "defined but never called by the official forward",
    "cap_first_emb.": "defined but never called by the official forward",
}


def detect(ckpt: dict[str, Any]) -> bool:
    """A TGDT checkpoint: a ``model`` state dict with the stage-2 text transformer, and its ``config``."""
    model = ckpt.get("model")
    return (
        isinstance(model, dict)
        and isinstance(ckpt.get("config"), dict)
        and any(isinstance(k, str) and k.startswith(_P + "transformer_encoder_text.") for k in model)
    )


class _Config:
    """The checkpoint's ``config``, read key by key; errors name ``config.<section>.<key>``."""

    def __init__(self, config: dict[str, Any], path: Path) -> None:
        self.config, self.path = config, path

    def get(self, section: str, key: str, default: Any = ...) -> Any:
        values = self.config.get(section)
        if isinstance(values, dict) and key in values:
            return values[key]
        if default is ...:
            raise ConfigError(f"config.{section}.{key}", f"missing from the config saved in {self.path}")
        return default

    def refuse(self, section: str, key: str, why: str) -> ConfigError:
        value = self.get(section, key, None)
        return ConfigError(f"config.{section}.{key}", f"{value!r} in {self.path} cannot be imported: {why}")


def _check_config(cfg: _Config) -> None:
    """Every official setting that changes the model or its evaluation, and that patchword cannot follow."""
    if cfg.get("dataset", "pre-extracted-features", False):
        raise cfg.refuse(
            "dataset",
            "pre-extracted-features",
            "the official precomputed-feature image encoder returns one embedding, which TGDT's forward "
            "cannot use (only the bottom-up branch runs)",
        )
    if cfg.get("image-model", "name") != "bottomup":
        raise cfg.refuse("image-model", "name", "TGDT's image branch is the bottom-up region encoder")
    if cfg.get("image-model", "pos-encoding", None) not in _BOX_ENCODINGS:
        raise cfg.refuse(
            "image-model",
            "pos-encoding",
            f"the box encodings of TERAN's post-processing are {_BOX_ENCODINGS}",
        )
    layers = cfg.get("image-model", "transformer-layers", 0)
    if not isinstance(layers, int) or layers < 0:
        raise cfg.refuse("image-model", "transformer-layers", "a number of layers (>= 0)")
    if layers and int(cfg.get("image-model", "feat-dim")) % _HEADS:
        raise cfg.refuse(
            "image-model", "feat-dim", f"not divisible by the {_HEADS} heads of the region transformer"
        )
    if cfg.get("text-model", "name") != "bert":
        raise cfg.refuse("text-model", "name", "TGDT's text branch is BERT")
    if cfg.get("text-model", "pre-extracted", False):
        raise cfg.refuse("text-model", "pre-extracted", "pre-extracted BERT features have no BERT to import")
    if cfg.get("text-model", "layers", 0):
        raise cfg.refuse(
            "text-model",
            "layers",
            "a transformer on BERT's output before cap_proj has no place in patchword's BERT encoder",
        )
    if cfg.get("model", "image-aggregation") != "first":
        raise cfg.refuse("model", "image-aggregation", "the image global embedding is the CLS slot ('first')")
    if cfg.get("model", "text-aggregation") not in ("first", "sum"):
        raise cfg.refuse("model", "text-aggregation", "patchword reads 'first' ([CLS]) or 'sum' (mean)")
    if cfg.get("model", "exclude-stopwords", False):
        raise cfg.refuse("model", "exclude-stopwords", "patchword's local similarity keeps every word")
    if cfg.get("training", "loss-type", "alignment+matching") not in (
        "alignment",
        "matching",
        "alignment+matching",
    ):
        raise cfg.refuse("training", "loss-type", "TGDT's losses are alignment, matching or both")
    if cfg.get("training", "measure", "dot") not in ("dot", "cosine"):
        raise cfg.refuse("training", "measure", "order embeddings are not implemented")


def _stage_layers(state: dict[str, Any], module: str, path: Path) -> dict[int, dict[str, torch.Tensor]]:
    """``{layer index: {parameter: tensor}}`` of the official ``nn.TransformerEncoder`` ``module``."""
    prefix = _P + module + "."
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        if key.startswith(prefix):
            match = _LAYER.match(key[len(prefix) :])
            if match is None:
                raise DataError(f"{path}: unexpected tensor {key} in the TGDT checkpoint")
            layers.setdefault(int(match.group(1)), {})[match.group(2)] = tensor
    if not layers:
        raise DataError(f"{path}: the TGDT checkpoint has no {prefix[:-1]} tensors")
    return layers


def _text_architecture(
    options: ImportOptions, cfg: _Config, state: dict[str, Any], path: Path
) -> dict[str, Any]:
    """The ``--hf-text`` architecture truncated to ``extraction-hidden-layer`` layers, checked against the
    checkpoint's BERT tensors (a mismatch names the tensor)."""
    arch = dict(
        hf_architecture(options.hf_text, "text", "--hf-text", local_files_only=options.local_files_only)
    )
    if arch.get("model_type") != "bert":
        raise ConfigError(
            "--hf-text", f"{options.hf_text} is a {arch.get('model_type')!r} model, TGDT uses BERT"
        )
    layers = cfg.get("text-model", "extraction-hidden-layer")
    arch["num_hidden_layers"] = int(layers)  # the official BertConfig is truncated to this depth
    key = _P + "txt_enc.bert_model.embeddings.word_embeddings.weight"
    if key not in state:
        raise DataError(f"{path}: the TGDT checkpoint has no {key}")
    want = (arch["vocab_size"], arch["hidden_size"])
    if tuple(state[key].shape) != want:
        raise DataError(
            f"{path}: {key} has shape {tuple(state[key].shape)}, but --hf-text {options.hf_text} describes "
            f"a BERT with vocab_size {want[0]} and hidden_size {want[1]}: give the BERT the run trained with"
        )
    word_dim = cfg.get("text-model", "word-dim")
    if word_dim != arch["hidden_size"]:
        raise ConfigError(
            "config.text-model.word-dim",
            f"is {word_dim}, but the checkpoint's BERT is {arch['hidden_size']}-d",
        )
    return arch


def _map_tensors(
    state: dict[str, Any], cfg: _Config, path: Path
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The official tensors under patchword's names, and the ones not loaded with the reason."""
    depth = int(cfg.get("model", "layers"))
    shared = bool(cfg.get("model", "shared-transformer", False))
    stages = {
        "image_encoder.context.layers": (
            "transformer_encoder_1" if shared else "transformer_encoder_2",
            "transformer_encoder_img",
        ),
        "text_encoder.context.layers": ("transformer_encoder_1", "transformer_encoder_text"),
    }
    post_layers = int(cfg.get("image-model", "transformer-layers", 0))
    post_active = bool(post_layers) or cfg.get("image-model", "pos-encoding", None) is not None
    mapped: dict[str, torch.Tensor] = {}

    def take_layers(module: str, target: str, offset: int, depth: int, key: str) -> None:
        layers = _stage_layers(state, module, path)
        if sorted(layers) != list(range(depth)):
            raise DataError(f"{path}: {_P}{module} has layers {sorted(layers)}, config.{key} says {depth}")
        for index, params in layers.items():
            mapped.update({f"{target}.{offset + index}.{name}": t for name, t in params.items()})

    for target, modules in stages.items():
        for offset, module in zip((0, depth), modules, strict=True):
            take_layers(module, target, offset, depth, "model.layers")
    modules = [m for ms in stages.values() for m in ms]
    if post_layers:
        take_layers(
            _POST[len(_P) :], "image_encoder.post.layers", 0, post_layers, "image-model.transformer-layers"
        )
        modules.append(_POST[len(_P) :])
    consumed = {k for k in state if any(k.startswith(f"{_P}{m}.") for m in modules)}
    renames = {
        _P + "img_proj.": ["image_encoder.proj."],
        _P + "cap_proj.": ["text_encoder.base.proj."],  # text_encoder.proj reads it through, unregistered
        _P + "txt_enc.bert_model.": ["text_encoder.base.backbone."],
    }
    if cfg.get("image-model", "pos-encoding", None) is not None:
        renames[_P + "img_enc.pos_encoding_image.map"] = ["image_encoder.post.box_map"]
    ignored: dict[str, str] = {}
    for key, tensor in state.items():
        if key in consumed:
            continue
        if key.endswith("embeddings.position_ids"):
            ignored[key] = "buffer of position indices, rebuilt by transformers"
            continue
        reason = next((why for prefix, why in _UNUSED.items() if key.startswith(prefix)), None)
        if reason is not None:
            ignored[key] = reason
            continue
        prefix = next((p for p in renames if key.startswith(p)), None)
        if prefix is None:
            raise DataError(
                f"{path}: unexpected tensor {key} in the TGDT checkpoint (not part of TGDT's model)"
            )
        for target in renames[prefix]:
            mapped[target + key[len(prefix) :]] = tensor
    bias = _P + "img_proj.bias"
    if bias not in state:
        raise DataError(f"{path}: the TGDT checkpoint has no {bias}")
    if not post_active:  # the zero CLS feature, projected: the constant prepended after the projection
        mapped["image_encoder.context.global_token"] = state[bias].detach().clone().reshape(1, 1, -1)
    return mapped, ignored


def _ffn_dim(state: dict[str, Any], module: str, path: Path) -> int:
    key = f"{_P}{module}.layers.0.linear1.weight"
    if key not in state:
        raise DataError(f"{path}: the TGDT checkpoint has no {key}")
    return int(state[key].shape[0])


def _inference(loss_type: str) -> str:
    """The evaluation the saved ``training.loss-type`` selects: ``test.py`` ranks by the local similarity
    alone for ``alignment`` and by the global one for ``matching``; the training configs of the released
    runs (``alignment+matching``) are evaluated by ``test_gl.py``'s two-stage hybrid."""
    return {"alignment": "local", "matching": "global"}.get(loss_type, "hybrid")


def _run_config(
    cfg: _Config,
    opt: dict[str, Any],
    options: ImportOptions,
    arch: dict[str, Any],
    state: dict[str, Any],
    path: Path,
):
    from patchword.data.config import DataConfig
    from patchword.encoders import ContextConfig, PrecompConfig, RegionPostConfig
    from patchword.eval.config import EvalConfig
    from patchword.model import ModelConfig, TGDTOptions
    from patchword.runs.config import RunConfig, TrainConfig

    embed = int(cfg.get("model", "embed-size"))
    if embed == arch["hidden_size"]:
        raise ConfigError(
            "config.model.embed-size",
            f"equals BERT's width ({embed}): patchword's text projection is the identity there, the official "
            "cap_proj a Linear layer",
        )
    if embed % _HEADS:
        raise ConfigError(
            "config.model.embed-size", f"{embed} is not divisible by the {_HEADS} official heads"
        )
    depth = int(cfg.get("model", "layers"))
    dropout = float(cfg.get("model", "dropout", 0.1))
    shared = bool(cfg.get("model", "shared-transformer", False))
    loss_type = str(cfg.get("training", "loss-type", "alignment+matching"))
    box_encoding = cfg.get("image-model", "pos-encoding", None)
    post_layers = int(cfg.get("image-model", "transformer-layers", 0))
    post = RegionPostConfig(
        layers=post_layers,
        heads=_HEADS,
        ffn_dim=_ffn_dim(state, _POST[len(_P) :], path) if post_layers else RegionPostConfig.ffn_dim,
        dropout=float(cfg.get("image-model", "dropout", 0.1)),
        box_encoding=box_encoding or "none",
    )
    model = ModelConfig(
        matcher="tgdt",
        embed_dim=embed,
        image_encoder="precomp",
        text_encoder="bert",
        hf_text=str(options.hf_text),
        precomp=PrecompConfig(
            region_dim=int(cfg.get("image-model", "feat-dim")),
            num_regions=36,  # the official bottom-up features (features_36); override for others
            embed_dim=embed,
            context=ContextConfig(
                layers=2 * depth,
                heads=_HEADS,
                ffn_dim=_ffn_dim(state, "transformer_encoder_1" if shared else "transformer_encoder_2", path),
                dropout=dropout,
                global_token=True,
                emit_stage1=True,
            ),
            post=post,
        ),
        text_context=ContextConfig(
            layers=2 * depth,
            heads=_HEADS,
            ffn_dim=_ffn_dim(state, "transformer_encoder_1", path),
            dropout=dropout,
            emit_stage1=True,
        ),
        tgdt=TGDTOptions(
            text_global="first" if cfg.get("model", "text-aggregation") == "first" else "mean",
            local_scale=10.0,  # hard-coded in AlignmentContrastiveLoss
            skip_text_head=1,  # [CLS]
            skip_text_tail=2,  # '.' and [SEP]: s_seq[:, 1:-2]
            inference=_inference(loss_type),
            hybrid_alpha=1.0,  # d_f = d_l + d_g
            shortlist_i2t=50,
            shortlist_t2i=100,
            local_tokens="stage1",  # the test-time local similarity reads stage 1 (switch_test())
        ),
    )
    data = DataConfig(
        dataset="precomp",
        tokenizer="bert",
        bert_vocab=BERT_VOCAB_FILE,
        dense=False,
        size_augment=False,  # the official data pipeline tokenises captions as they are
        region_boxes=box_encoding is not None,  # {split}_boxes.npy beside the features
        max_caption_len=min(_MAX_CAPTION_TOKENS, int(arch.get("max_position_embeddings", 512))),
    )
    epochs = int(opt.get("num_epochs", TrainConfig.epochs))
    step = cfg.get("training", "step-size", None)
    scheduled = cfg.get("training", "scheduler", None) == "steplr" and step
    train = TrainConfig(
        epochs=epochs,
        batch_size=int(cfg.get("training", "bs", TrainConfig.batch_size)),
        lr=float(cfg.get("training", "lr", TrainConfig.lr)),
        backbone_lr_mult=1.0 if cfg.get("text-model", "fine-tune", True) else 0.0,
        margin=float(cfg.get("training", "margin", TrainConfig.margin)),
        grad_clip=max(0.0, float(cfg.get("training", "grad-clip", TrainConfig.grad_clip) or 0.0)),
        hardest_after_epochs=0 if cfg.get("training", "max-violation", True) else epochs,
        align_warmup_epochs=0,  # the official alignment loss has its full weight from the first step
        lr_milestones=list(range(int(step), epochs, int(step))) if scheduled else [],
        lr_decay=float(cfg.get("training", "gamma", 0.1)),
    )
    evaluation = EvalConfig(coco_1k=cfg.get("dataset", "name", "") == "coco")
    return RunConfig(data=data, model=model, train=train, eval=evaluation)


def _flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config.<section>.<key>`` -> value, for import.json."""
    out: dict[str, Any] = {}
    for section, values in config.items():
        if isinstance(values, dict):
            out.update({f"config.{section}.{k}": v for k, v in values.items()})
        else:
            out[f"config.{section}"] = values
    return out


def convert(ckpt: dict[str, Any], options: ImportOptions, path: Path) -> ImportPlan:
    """Map a TGDT checkpoint's ``config`` / ``opt`` onto a run config and its tensors onto patchword's names.

    Raises:
        ConfigError: a ``config`` value patchword cannot represent (naming ``config.<section>.<key>``), no
            or an unusable ``--hf-text``.
        DataError: a tensor that does not fit (naming it), a missing official module.
    """
    state = ckpt.get("model")
    if not isinstance(state, dict):
        raise DataError(f"{path}: a TGDT checkpoint holds its weights under 'model'")
    for option in ("hf_vision", "vocab", "dense_pairing"):
        if getattr(options, option):
            raise ConfigError(f"--{option.replace('_', '-')}", "does not apply to a TGDT checkpoint")
    cfg = _Config(ckpt["config"], path)
    _check_config(cfg)
    opt = opt_dict(ckpt, str(path)) if "opt" in ckpt else {}
    arch = _text_architecture(options, cfg, state, path)
    run = _run_config(cfg, opt, options, arch, state, path)
    mapped, ignored = _map_tensors(state, cfg, path)
    for entry in ("optimizer", "scheduler"):
        if ckpt.get(entry) is not None:
            ignored[entry] = f"{entry} state: an imported run starts training afresh"
    metadata = {
        "config_not_mapped": {
            "training.alignment-mode": "ignored by the official code (always MrSw x10)",
            "training.warmup": "training only: patchword has no linear warm-up",
            "training.matching-weight": "never read by the official code",
            "training.alignment-weight": "never read by the official code",
        },
        "epoch": ckpt.get("epoch"),
        "Eiters": ckpt.get("Eiters"),
        "dataset": cfg.get("dataset", "name", None),
        "inference": run.model.tgdt.inference,
        "local_tokens": "stage 1's in evaluation (the official switch_test()), the whole stack's in training",
        "data": "set data.root to a precomp directory of the same bottom-up features (36 regions of "
        f"{run.model.precomp.region_dim}-d)"
        + (
            " with their boxes in {split}_boxes.npy ((N_img, 36, 4), [x1, y1, x2, y2] / image size)"
            if run.data.region_boxes
            else ""
        ),
    }
    depth = int(cfg.get("model", "layers"))
    _logger.info(
        "%s: TGDT, %d-d, %d + %d layers per modality; regions: %d-layer post-processing, box encoding %s",
        path,
        run.model.embed_dim,
        depth,
        depth,
        run.model.precomp.post.layers,
        run.model.precomp.post.box_encoding,
    )
    return ImportPlan(
        family=FAMILY,
        config=run,
        state_dict=mapped,
        ignored=ignored,
        opt={**opt, **_flat_config(ckpt["config"])},
        architectures={"text": arch},
        metadata=metadata,
        bert_files=bert_vocab_file(str(options.hf_text), arch, local_files_only=options.local_files_only),
        dataset=_DATASETS.get(str(cfg.get("dataset", "name", None))),
    )


#: The data keys the checkpoint decides (its BERT tokens and their length, no dense text, captions as they
#: are, boxes when its region encoder encodes them): an import override may not change them.
_DETERMINED = (
    "data.tokenizer",
    "data.bert_vocab",
    "data.max_caption_len",
    "data.dense",
    "data.size_augment",
    "data.region_boxes",
)

register_family(
    FAMILY,
    "TGDT (LCFractal/TGDT model_best_rsum.pth.tar: regions + BERT, token-guided transformers; --hf-text)",
    detect,
    convert,
    reads=("hf_text",),
    determines=_DETERMINED,
)
