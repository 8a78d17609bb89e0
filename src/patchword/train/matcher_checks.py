"""The matcher of a run checked against what it declared at registration, before anything is written.

:func:`check_matcher` reads only the config and the matcher's registration (:mod:`patchword.matching.
registry`), never a matcher's name: its training losses, chunking, its options (the library's
:func:`~patchword.model.check_matcher_options`, which every build runs: the options its preset fixes, the
options themselves, sections it does not read) and the image tokens it takes (a matcher whose options have no
``has_cls`` takes none with a CLS token first). Every failure is a
:class:`~patchword.errors.ConfigError` naming the key to change.
"""

from __future__ import annotations

import dataclasses

from patchword.data.prepare import REGION_DATASETS
from patchword.errors import ConfigError
from patchword.matching.registry import list_matchers, matcher_spec
from patchword.model import check_matcher_options
from patchword.model.matcher_options import split_saved_geometry
from patchword.runs.config import RunConfig

__all__ = ["check_matcher"]


def check_matcher(cfg: RunConfig, *, resuming: bool = False) -> None:
    """What the matcher declared at registration, checked against the config: its training losses,
    chunking, the options its preset fixes, its options themselves, sections it does not read, the image
    encoder's CLS token.

    ``resuming``: ``cfg`` is a saved run's. The token geometry (``embed_dim``, ``num_patches``,
    ``has_cls``) a plug-in run saved before it was refused in ``model.options`` holds there is left to the
    build, as ``load_run`` and ``patchword eval`` leave it (:func:`~patchword.model.matcher_options.
    split_saved_geometry`): a value that agrees with the encoders' is dropped, one that disagrees named.

    Raises:
        ConfigError: naming the first offending key.
    """
    mc, tc = cfg.model, cfg.train
    try:
        spec = matcher_spec(mc.matcher)
    except KeyError:
        raise ConfigError(
            "model.matcher", f"unknown matcher {mc.matcher!r}; registered: {', '.join(list_matchers())}"
        ) from None
    if tc.loss not in spec.losses:
        why = (
            "infonce scales the sims by a learned temperature: a matcher that has one, e.g. clip or filip"
            if tc.loss == "infonce"
            else "it has a learned temperature, which only infonce reads: set train.loss=infonce"
            if "infonce" in spec.losses
            else f"set train.loss={spec.losses[0]}"
        )
        raise ConfigError(
            "train.loss",
            f"model.matcher={mc.matcher} trains with {' or '.join(spec.losses)}, not {tc.loss} ({why})",
        )
    if tc.pair_chunk and not spec.pair_chunk:
        raise ConfigError("train.pair_chunk", f"model.matcher={mc.matcher} does not chunk its training step")
    # the options themselves, as every build checks them (create_model, load_run, patchword eval), and
    # here the sections of other matchers too: before anything is written; a resumed run's saved geometry
    # is its build's to check against the encoders (config.yaml is never rewritten)
    check_matcher_options(split_saved_geometry(mc)[0] if resuming else mc)
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}
    if "has_cls" not in fields:
        _check_no_cls_token(cfg)


def _check_no_cls_token(cfg: RunConfig) -> None:
    """A matcher whose options have no ``has_cls`` treats every image token as a region: an image encoder
    that puts a CLS (or global) token first is refused here, naming the setting, rather than by the
    matcher's build (``has_cls=True``) after the data was read. An ``hf`` backbone (ViT: CLS; Swin: none) is
    known only once its config is read, and is left to the build."""
    mc = cfg.model
    takes = f"model.matcher={mc.matcher} takes image tokens without a CLS token (region features)"
    if mc.image_encoder == "tiny":
        raise ConfigError(
            "model.image_encoder",
            f"{takes}, but model.image_encoder=tiny puts a CLS token first: use model.image_encoder=precomp "
            f"(data.dataset={' or '.join(REGION_DATASETS)})",
        )
    if mc.image_encoder == "precomp" and mc.precomp.context.global_token:
        raise ConfigError(
            "model.precomp.context.global_token",
            f"{takes}, but a global token would come first: set it false",
        )
