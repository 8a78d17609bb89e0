"""The training settings of a run checked against what reads them, before anything is written: the
optimiser's, the schedule's and the loss's factors in range, and no setting that cannot take effect.

A value other than its default that nothing reads (``train.margin`` under ``train.loss=infonce``,
``train.backbone_lr_mult`` without a pretrained encoder, ``train.wandb_project`` without wandb in
``train.report_to``, caption-tied dense text without dense text, a learned temperature's options under
the hinge...) is refused with the reason: a run
that silently ignores what it was told is recorded, compared and reported as if it had applied it. Only
new runs are checked for settings without effect (as for ``train.compile_scope``): a resumed run keeps
the settings it trained with, and cannot change them.
"""

from __future__ import annotations

import dataclasses

from patchword._validation import check_at_least, check_finite_number
from patchword.data.prepare import reads_dense_text
from patchword.errors import ConfigError
from patchword.matching.registry import matcher_spec
from patchword.model import (
    RetrievalModel,
    matcher_arguments,
    matcher_section,
    model_reads_dense,
    started_pretrained,
)
from patchword.runs.config import RunConfig, TrainConfig

__all__ = ["check_model_settings", "check_optimiser", "check_settings_take_effect"]

_DEFAULTS = TrainConfig()


def _ratio(value: float, key: str) -> None:
    if not 0 < value <= 1:
        raise ConfigError(key, f"must lie in (0, 1], got {value!r}")


def check_optimiser(cfg: RunConfig, *, resuming: bool = False) -> None:
    """AdamW's, the schedule's and the loss's factors: checked here, or AdamW refuses a negative weight decay
    after the run directory was written, a negative decay gives negative learning rates without a word, and
    an infinite margin makes every loss non-finite, every step skipped, and the run still "succeeds". A new
    run's milestones and epoch counts are checked too: a milestone at epoch -1 or step 0 is never reached (a
    decay never applied), a negative epoch count is the same as 0 (``resuming``: the saved run's own)."""
    tc = cfg.train
    for key, value in (
        ("train.weight_decay", tc.weight_decay),
        ("train.backbone_lr_mult", tc.backbone_lr_mult),
        ("train.margin", tc.margin),
        ("train.ratio_weight", tc.ratio_weight),
    ):
        check_finite_number(key, value)
    _ratio(tc.lr_decay, "train.lr_decay")  # the factor each milestone multiplies the learning rates by
    if resuming:
        return
    for key, values, low, unit in (
        ("train.lr_milestones", tc.lr_milestones, 0, "epochs (0: the first epoch's start)"),
        ("train.lr_milestone_steps", tc.lr_milestone_steps, 1, "optimiser steps done, counted from 1"),
    ):
        bad = [v for v in values if not v >= low]
        if bad:
            raise ConfigError(key, f"are {unit}: each must be >= {low}, got {bad[0]!r} (never reached)")
    check_at_least("train.hardest_after_epochs", tc.hardest_after_epochs, 0, "0: hardest negatives at once")
    check_at_least("train.align_warmup_epochs", tc.align_warmup_epochs, 0, "0: no warm-up")


def _refuse_changed(tc: TrainConfig, name: str, why: str) -> None:
    """Refuse ``train.<name>`` when it is not its default: it has no effect, ``why``."""
    default = getattr(_DEFAULTS, name)
    if getattr(tc, name) != default:
        raise ConfigError(f"train.{name}", f"has no effect {why}: leave it at its default ({default!r})")


def check_settings_take_effect(cfg: RunConfig) -> None:
    """A new run's settings that nothing would read, when not at their defaults (see the module docstring).

    Raises:
        ConfigError: naming the key and why it cannot take effect.
    """
    tc, mc = cfg.train, cfg.model
    # the hinge reads them, and TGDT's CMC loss on the global embeddings (a matcher's global_loss)
    if tc.loss != "hinge" and matcher_spec(mc.matcher).cls.global_loss is None:
        for name in ("margin", "hardest_after_epochs"):
            _refuse_changed(tc, name, f"with train.loss={tc.loss} (a setting of the hinge loss)")
    if not any(started_pretrained(mc)):
        why = (
            "without a pretrained encoder (model.image_encoder=hf, model.text_encoder=bert or "
            "model.tiny_pretrained): every parameter trains at train.lr"
        )
        _refuse_changed(tc, "backbone_lr_mult", why)
    if "wandb" not in tc.report_to:
        for name in ("wandb_project", "wandb_mode"):
            _refuse_changed(tc, name, "without wandb in train.report_to")
    _check_dense_pairing(cfg)
    if tc.loss != "infonce":
        _check_temperature_read(cfg)


#: Option fields of a learned temperature (CLIP's ``logit_scale``), which only ``train.loss=infonce``
#: reads: the hinge scores the matcher's sims as they are.
TEMPERATURE_FIELDS = ("learn_temperature", "init_temperature", "max_logit_scale")


def _check_temperature_read(cfg: RunConfig) -> None:
    """A learned temperature's option set to another value than its default under a loss that does not
    read the temperature (the hinge): it would be recorded as if applied while nothing moved."""
    mc = cfg.model
    spec = matcher_spec(mc.matcher)
    defaults = {f.name: f.default for f in dataclasses.fields(spec.config_cls)}
    why = (
        "the learned temperature scales only infonce's logits (set train.loss=infonce, or leave it at its "
        "default)"
        if "infonce" in spec.losses
        else f"model.matcher={spec.name} learns no temperature (leave it at its default)"
    )
    options = matcher_arguments(mc)
    for key in TEMPERATURE_FIELDS:
        if key in options and options[key] != defaults[key]:
            raise ConfigError(
                f"model.{matcher_section(mc.matcher)}.{key}",
                f"has no effect with train.loss={cfg.train.loss}: {why}",
            )


def _check_dense_pairing(cfg: RunConfig) -> None:
    """Caption-tied dense text (``dense_pairing=caption``) where no dense text is read."""
    mc, dc = cfg.model, cfg.data
    spec = matcher_spec(mc.matcher)
    fields = {f.name: f.default for f in dataclasses.fields(spec.config_cls)}
    pairing = matcher_arguments(mc).get("dense_pairing", fields.get("dense_pairing"))
    if "dense_pairing" not in fields or pairing == fields["dense_pairing"]:
        return
    key = f"model.{matcher_section(mc.matcher)}.dense_pairing"
    if not dc.dense:
        raise ConfigError(
            key, f"{pairing} has no effect with data.dense=false (no dense text is read): set data.dense=true"
        )
    if not reads_dense_text(dc, model_reads_dense(mc)):
        raise ConfigError(
            key, f"{pairing} has no effect: model.matcher={mc.matcher} reads no dense text here"
        )


def check_model_settings(cfg: RunConfig, model: RetrievalModel) -> None:
    """A new run's settings that its built ``model`` would not read: ``train.ratio_weight`` without patch
    selection (the ratio loss pulls the kept share of selected patches towards the matcher's ratio).

    Raises:
        ConfigError: naming the key.
    """
    if not model.matcher.selection_ratio:
        why = f"with model.matcher={cfg.model.matcher}, which selects no patches (there is no ratio loss)"
        _refuse_changed(cfg.train, "ratio_weight", why)
