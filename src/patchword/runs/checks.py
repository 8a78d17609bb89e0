"""Whether a run's data fits its model: checks shared by training (before the first step) and evaluation.

Each failure is a :class:`~patchword.errors.ConfigError` naming the key to change, or a
:class:`~patchword.errors.DataError` naming the file where the splits disagree with each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from patchword._validation import check_at_least
from patchword.data.config import DataConfig
from patchword.data.prepare import (
    CAPTION_COUNT_DATASETS,
    REGION_DATASETS,
    SYNTHETIC_DATASETS,
    PreparedData,
    eval_role,
)
from patchword.errors import ConfigError, DataError
from patchword.eval.engine.base import PRECISIONS
from patchword.eval.engine.core import declared_precisions
from patchword.eval.protocol import check_coco_1k
from patchword.model import RetrievalModel
from patchword.runs.config import RunConfig

if TYPE_CHECKING:
    from patchword.eval.coco_extended import CocoGroundTruth

__all__ = [
    "check_pretrained_sources",
    "resolve_bert_vocab",
    "check_eval_precision",
    "check_eval_settings",
    "check_eval_split",
    "check_model_data",
    "check_region_boxes",
    "check_region_shapes",
    "data_image_size",
]


def data_image_size(cfg: RunConfig) -> int | None:
    """Side in pixels of the images the data feeds the image encoder (None for region features)."""
    dc = cfg.data
    if dc.dataset in REGION_DATASETS:
        return None
    return dc.synthetic_image_size if dc.dataset in SYNTHETIC_DATASETS else dc.image_size


def check_region_boxes(cfg: RunConfig) -> None:
    """Boxes appended to the region features (``data.region_boxes``) exactly when the model encodes them;
    ``data.captions_per_image`` set only for a dataset that reads it."""
    dc, mc = cfg.data, cfg.model
    region_data = dc.dataset in REGION_DATASETS
    if dc.captions_per_image != DataConfig.captions_per_image and dc.dataset not in CAPTION_COUNT_DATASETS:
        why = (
            "its json lists each image's own sentences"
            if dc.dataset == "karpathy"
            else "the scenes are generated with 5 captions each"
        )
        raise ConfigError(
            "data.captions_per_image",
            f"is read by data.dataset={' or '.join(CAPTION_COUNT_DATASETS)} (files with one id or feature "
            f"row per image), not {dc.dataset}: {why}; leave it out",
        )
    if dc.region_boxes and dc.dataset != "precomp":
        raise ConfigError(
            "data.region_boxes", f"reads {{split}}_boxes.npy of data.dataset=precomp, not {dc.dataset}"
        )
    if region_data and dc.region_boxes != mc.precomp.post.reads_boxes:
        if dc.region_boxes:
            raise ConfigError(
                "data.region_boxes",
                "appends boxes to the region features, but model.precomp.post.box_encoding is none: set "
                "the box encoding the model was trained with, or data.region_boxes=false",
            )
        raise ConfigError(
            "data.region_boxes",
            f"model.precomp.post.box_encoding={mc.precomp.post.box_encoding} encodes each region's box: set "
            "data.region_boxes=true and put {split}_boxes.npy (N_img, R, 4, normalised) beside the features",
        )


def resolve_bert_vocab(cfg: RunConfig) -> bool:
    """Set an empty ``data.bert_vocab`` of a BERT-tokenised run to its text backbone's (``model.hf_text``),
    in place: the vocabulary the backbone was trained with (``create_model_and_transforms`` reads the same),
    and the value a new run writes into its config.yaml. Returns whether it was empty."""
    dc, mc = cfg.data, cfg.model
    if dc.tokenizer != "bert" or dc.bert_vocab:
        return False
    dc.bert_vocab = dc.bert_vocab_source(mc.hf_text if mc.text_encoder == "bert" else None)
    return True


def check_pretrained_sources(cfg: RunConfig, *, vocab_from_hf_text: bool = False) -> None:
    """The Hugging Face backbones and BERT vocabulary a new run reads, found and described (config.json, a
    supported ``model_type``, weights files) before any data is read; their weights are read when the model
    is built. ``vocab_from_hf_text``: :func:`resolve_bert_vocab` set ``data.bert_vocab``.

    Raises:
        ConfigError: naming ``model.hf_vision``, ``model.hf_text`` or ``data.bert_vocab``, the path and why.
    """
    from patchword.data.tokenizers import BertCaptionTokenizer
    from patchword.encoders.hf import check_backbone_source
    from patchword.hub import keyed_source_errors

    mc, dc = cfg.model, cfg.data
    offline = mc.hf_local_files_only
    for key, source, role, used in (
        ("model.hf_vision", mc.hf_vision, "vision", mc.image_encoder == "hf"),
        ("model.hf_text", mc.hf_text, "text", mc.text_encoder == "bert"),
    ):
        if used:
            with keyed_source_errors(key, source):
                check_backbone_source(source, role, local_files_only=offline)
    if dc.tokenizer == "bert":  # read whole (a vocabulary file is small): it fails now, not after the data
        note = "not set, so model.hf_text's vocabulary is read: " if vocab_from_hf_text else ""
        with keyed_source_errors("data.bert_vocab", dc.bert_vocab, note):
            BertCaptionTokenizer.from_pretrained(dc.bert_vocab, local_files_only=offline)


def check_model_data(cfg: RunConfig, model: RetrievalModel, data: PreparedData) -> None:
    """Check the built model against the data and tokenizer (before training starts, and before
    ``patchword eval`` scores anything), and the ``eval`` keys against the split they evaluate
    (:func:`check_eval_split`).

    Raises:
        ConfigError: image size, text length or vocabulary the encoders cannot take, region features of
            another shape than the model expects, or an ``eval`` protocol the evaluated split cannot take;
            each names the key to change.
        DataError: a split whose region features differ in shape from a fitting one
            (:func:`check_region_shapes`).
    """
    role = eval_role(cfg.data, cfg.eval.split)
    if role in data.splits:
        check_eval_split(cfg, data.splits[role])
    dc, mc = cfg.data, cfg.model
    image_enc, text_enc = model.image_encoder, model.text_encoder
    want = data_image_size(cfg)
    if want is not None and image_enc.image_size is not None and image_enc.image_size != want:
        key = "data.synthetic_image_size" if dc.dataset in SYNTHETIC_DATASETS else "data.image_size"
        takes = (
            f"model.tiny_vit.image_size is {image_enc.image_size}"  # as training's config check says it
            if mc.image_encoder == "tiny"
            else f"the image encoder ({_encoder_key(mc, 'image')}) takes {image_enc.image_size} pixels"
        )
        raise ConfigError(key, f"is {want} but {takes}")
    if text_enc.max_len is not None:
        lengths = [("data.max_caption_len", dc.max_caption_len)]
        if any(split.dense_ids is not None for split in data.splits.values()):
            lengths.append(("data.max_dense_len", dc.max_dense_len))
        for key, length in lengths:
            if length > text_enc.max_len:
                raise ConfigError(key, f"is {length} but the text encoder has {text_enc.max_len} positions")
    vocab = data.vocab_size if data.vocab_size is not None else getattr(data.tokenizer, "vocab_size", None)
    if vocab is not None and text_enc.vocab_size is not None and vocab > text_enc.vocab_size:
        raise ConfigError(
            "data.bert_vocab" if dc.tokenizer == "bert" else "data.vocab_path",
            f"the tokenizer has {vocab} ids but the text encoder ({_encoder_key(mc, 'text')}) embeds "
            f"{text_enc.vocab_size}",
        )
    check_region_boxes(cfg)
    if dc.dataset in REGION_DATASETS:
        check_region_shapes(cfg, data)


def _encoder_key(mc, side: str) -> str:
    """The key that names the ``side`` ("image" or "text") encoder in use: ``model.hf_vision=ID`` /
    ``model.hf_text=ID`` for a Hugging Face backbone, else ``model.image_encoder=tiny`` (or the text
    encoder's kind), never the name of a backbone the run does not use."""
    kind = mc.image_encoder if side == "image" else mc.text_encoder
    if side == "image" and kind == "hf":
        return f"model.hf_vision={mc.hf_vision}"
    if side == "text" and kind == "bert":
        return f"model.hf_text={mc.hf_text}"
    return f"model.{side}_encoder={kind}"


def check_region_shapes(cfg: RunConfig, data: PreparedData) -> None:
    """Every split's region features (N_img, R, D) against ``model.precomp`` (R, D): each split is
    checked, so a test split of another shape fails before training, not at the final evaluation.

    Raises:
        DataError: a split whose shape differs from that of another split which fits ``model.precomp``,
            naming the odd split's ``{split}_ims.npy``.
        ConfigError: ``model.precomp``, when no split fits it.
    """
    dc, mc = cfg.data, cfg.model
    expected = (mc.precomp.num_regions, mc.precomp.region_dim)
    shapes = {role: (split.images.num_regions, split.images.dim) for role, split in data.splits.items()}
    setting = f"model.precomp.num_regions={expected[0]}, model.precomp.region_dim={expected[1]}"
    for role, have in shapes.items():
        if have == expected:
            continue
        name = data.splits[role].name
        where = (
            str(Path(dc.root).expanduser() / f"{name}_ims.npy")
            if dc.dataset == "precomp"
            else f"the synthetic region features of the {role} split"
        )
        fitting = [other for other, shape in shapes.items() if shape == expected]
        if fitting:
            raise DataError(
                f"{where}: the {role} split has {have[0]} regions of {have[1]} dims, but the {fitting[0]} "
                f"split has {expected[0]} of {expected[1]} ({setting}); every split needs the same region "
                "features (the same detector and number of boxes)"
            )
        raise ConfigError(
            "model.precomp",
            f"the region features ({where}) have {have[0]} regions of {have[1]} dims but {setting}",
        )


def check_eval_precision(cfg: RunConfig, device: torch.device) -> None:
    """``eval.precision``: one that the matcher's scoring engine offers, TF32 on a CUDA ``device`` only
    (before training, and before ``patchword eval`` loads any data)."""
    precision, matcher = cfg.eval.precision, cfg.model.matcher
    if precision not in PRECISIONS:
        raise ConfigError("eval.precision", f"must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    offered = declared_precisions(matcher)
    if precision not in offered:
        raise ConfigError(
            "eval.precision", f"the {matcher} scoring engine computes in {', '.join(offered)} only"
        )
    if precision == "tf32" and device.type != "cuda":
        raise ConfigError("eval.precision", f"tf32 uses CUDA tensor cores; the run's device is {device}")


#: The lowest value of each numeric ``eval`` key: a batch holds at least one image or text; a memory
#: budget of 0 MiB means the automatic one (``eval.engine.memory.configured_budget_mb``).
EVAL_MINIMUMS = {"batch_size": 1, "max_memory_mb": 0}


#: The COCO 5K test split (``testall``) that ECCV Caption and CxC annotate.
COCO_5K_IMAGES, COCO_5K_CAPTIONS = 5000, 25000


def check_eval_settings(
    cfg: RunConfig,
    device: torch.device,
    ground_truth: CocoGroundTruth | None = None,
    *,
    load_ground_truth: bool = True,
) -> CocoGroundTruth | None:
    """The ``eval`` section, before any data is read: the numeric keys' ranges, ``eval.precision``
    against the matcher and ``device``, ``eval.coco_extended`` against the dataset and its ground truth
    files (``patchword eval`` and ``train.validate.check_config`` both call it; :func:`check_eval_split`
    checks the protocols against the split once it is read).

    Args:
        ground_truth: the COCO ground truth an earlier call returned (another member of an ensemble): not
            read again.
        load_ground_truth: False leaves the ground truth (an extra and its files) to whoever evaluates
            (an import made where they are not): ``ground_truth`` is returned as given.

    Returns:
        With ``eval.coco_extended``, the ground truth read now (or ``ground_truth``), for the scoring to
        use rather than read the files a second time; else ``ground_truth`` as given.

    Raises:
        ConfigError: naming the first offending key.
        MissingExtraError, MissingFileError: ``eval.coco_extended`` without its ground truth.
    """
    for name, low in EVAL_MINIMUMS.items():
        check_at_least(f"eval.{name}", getattr(cfg.eval, name), low)
    check_eval_precision(cfg, device)
    if cfg.eval.coco_extended:
        if cfg.data.dataset in SYNTHETIC_DATASETS:
            raise ConfigError("eval.coco_extended", "needs the COCO 5K test split (ECCV Caption / CxC ids)")
        if ground_truth is None and load_ground_truth:
            from patchword.eval.coco_extended import CocoGroundTruth

            # the extra and its data, now rather than after scoring (or training)
            ground_truth = CocoGroundTruth.load()
    return ground_truth


def check_eval_split(cfg: RunConfig, split) -> None:
    """``eval.coco_1k`` and ``eval.coco_extended`` against the split they evaluate (an EncodedSplit), once
    it is read and before anything is scored: both are COCO 5K protocols. On another split the 1K folds
    would silently be folds of 200 images (a 1K split) or of uneven sizes, and the ECCV Caption / CxC
    metrics would fail after the whole split was scored, writing nothing.

    Raises:
        ConfigError: naming the key and ``data.test_split=testall``.
    """
    if cfg.eval.coco_1k:
        check_coco_1k(split.num_images)
    have = (split.num_images, split.num_captions)
    if cfg.eval.coco_extended and have != (COCO_5K_IMAGES, COCO_5K_CAPTIONS):
        raise ConfigError(
            "eval.coco_extended",
            f"ECCV Caption / CxC rank the COCO 5K test split ({COCO_5K_IMAGES} images, {COCO_5K_CAPTIONS} "
            f"captions), but the evaluated split has {have[0]} images and {have[1]} captions: set "
            "data.test_split=testall (COCO 5K), or eval.coco_extended=false",
        )
