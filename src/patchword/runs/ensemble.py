"""What makes an ensemble of runs an ensemble (``patchword eval RUN --ensemble OTHER ...``): its members are
distinct weights, and their score scales are comparable enough for an average to mean something.

:func:`~patchword.runs.evaluate.evaluate_run_dir` calls these; the averaging itself is
:func:`patchword.eval.protocol.ensemble_metrics`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "member",
    "in_member",
    "member_overrides",
    "shared_metadata",
    "refuse_repeated_members",
    "shared_split",
    "warn_of_scales",
    "weights_digest",
]

_logger = logging.getLogger(__name__)


def member(path: Path) -> tuple[Path, Path | None]:
    """``RUN_DIR`` or ``RUN_DIR/ckpt.pt`` -> (run directory, checkpoint or None for best.pt)."""
    return (path.parent, path) if path.is_file() else (path, None)


@contextlib.contextmanager
def in_member(member_dir: Path, ensembled: bool) -> Iterator[None]:
    """A :class:`~patchword.errors.ConfigError` the block raises for one member of an ensemble
    (``ensembled``) names that member's run, which its key alone does not (``model.matcher: unknown
    matcher ...`` of the fourth ``--ensemble`` run); one of a single run's evaluation is left as it is."""
    from patchword.errors import ConfigError

    try:
        yield
    except ConfigError as err:
        if not ensembled:
            raise
        raise ConfigError(err.key, f"in ensemble member {member_dir}: {err.detail}") from None


def member_overrides(models: list, overrides: list[str]) -> list[list[str]]:
    """Each member's share of an ensemble's overrides (``models``: the members' ``ModelConfig`` with the
    overrides applied): an override of a matcher section some members' matchers do not read
    (``model.seps.sparse_ratio`` on SEPS + VSE) applies to the members that read it; one no member reads would
    do nothing and is refused (:func:`~patchword.model.unread_option_overrides`).

    Raises:
        ConfigError: naming the key no member reads and the sections they read.
    """
    from patchword.errors import ConfigError
    from patchword.model import matcher_section, unread_option_overrides

    unread = [unread_option_overrides(model, overrides) for model in models]
    for item, key in unread[0].items():
        if all(item in other for other in unread):
            sections = ", ".join(dict.fromkeys(f"model.{matcher_section(m.matcher)}" for m in models))
            raise ConfigError(
                key, f"has no effect on any member of the ensemble (their matchers read {sections})"
            )
    return [[item for item in overrides if item not in skipped] for skipped in unread]


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 of a model state dict: names, dtypes, shapes and values, in name order. Two checkpoints with
    the same digest hold the same model whatever else they hold (optimizer state, step, dates)."""
    digest = hashlib.sha256()
    for name in sorted(state):
        value = state[name]
        if not isinstance(value, torch.Tensor):
            digest.update(f"{name}={value!r};".encode())
            continue
        tensor = value.detach().to("cpu").contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        # a zero-dimensional tensor cannot be viewed as bytes: flatten first; any dtype views as uint8
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def refuse_repeated_members(checkpoints: list[Path]) -> None:
    """An ensemble's members are distinct weights: a checkpoint given twice (the same file, a copy, or
    another file with the same model weights, such as a run's ``best.pt`` and ``last.pt`` saved at the same
    step, or an export's ``model.safetensors``) would weigh one model twice and call it an ensemble.

    Raises:
        ConfigError: naming the repeated member and the one it repeats.
    """
    from patchword.checkpoint import load_weights
    from patchword.errors import ConfigError

    seen: dict[str, Path] = {}
    for path in checkpoints:  # one member's weights in memory at a time
        digest = weights_digest(load_weights(path))
        if digest in seen:
            raise ConfigError(
                "--ensemble",
                f"{path} holds the same model weights as {seen[digest]}: an ensemble averages distinct "
                "models; give each run (or checkpoint) once",
            )
        seen[digest] = path


def warn_of_scales(results: list[tuple[dict, dict]], scores: list) -> None:
    """Record each member's score spread (``"score_spread"``, :func:`~patchword.eval.protocol.score_spread`)
    and warn when they differ by more than 10x: the average is then in effect the widest member's scores
    (SCAN / NAAF average unnormalised scores, and so does the ensemble here)."""
    from patchword.eval.protocol import score_spread, spreads_disagree

    spreads = [score_spread(sims) for sims in scores]
    for (meta, _), spread in zip(results, spreads, strict=True):
        meta["score_spread"] = spread
    if spreads_disagree(spreads):
        named = ", ".join(
            f"{meta['run_dir']} ({meta['matcher']}): {spread:.3g}"
            for (meta, _), spread in zip(results, spreads, strict=True)
        )
        _logger.warning(
            "the ensemble's members score on scales more than 10x apart (std of each member's scores: %s): "
            "the average of their scores is in effect the widest member's",
            named,
        )


#: A split's uses (``run_metadata``'s ``"split_use"``: :data:`patchword.imports.published.SELECTION_SPLIT`
#: and ``TRAINING_SPLIT``), the least held-out last: an ensemble's is its
#: members' last (a member trained on the captions, or chose its checkpoint on them, compromises the average).
_USES = (None, "model selection", "training")


def shared_split(metas: list[dict]) -> dict:
    """What an ensemble scored, from its members' metadata (``metas``; their captions are checked equal):
    ``"split"`` (the role, one for all), ``"data_split"`` (the members' names of it, joined with `` / `` when
    their configs name it differently) and ``"split_use"``, the least held-out of the members' (None only
    when the split is held out of every member's training and checkpoint selection)."""
    names = list(dict.fromkeys(str(m.get("data_split")) for m in metas))
    uses = [m.get("split_use") for m in metas]
    return {
        "split": metas[0]["split"],
        "data_split": names[0] if len(names) == 1 else " / ".join(names),
        "split_use": max(uses, key=_USES.index),
    }


#: What an ensemble's record says of the gallery and the scoring at its top level where every member's
#: :func:`~patchword.runs.evaluate.run_metadata` agrees (each member's own record keeps its value; a key
#: they differ in is only there).
ENSEMBLE_SHARED = (
    "images",
    "captions",
    "known_captions",
    "eval_precision",
    "model_dtype",
    "dense_pairing",
)


def shared_metadata(metas: list[dict[str, Any]]) -> dict[str, Any]:
    """The :data:`ENSEMBLE_SHARED` values every member's metadata (``metas``) agrees on."""
    return {
        key: metas[0][key]
        for key in ENSEMBLE_SHARED
        if key in metas[0] and all(key in m and m[key] == metas[0][key] for m in metas)
    }
