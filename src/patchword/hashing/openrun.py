"""A trained hashing run loaded back for ``hash eval`` and ``hash search``: its config with the command's
overrides (evaluation options, the device, where its data lie now), its model with the trained weights, its
data (checked to be the run's, or other data given on purpose) and the checkpoint the weights come from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from patchword.checkpoint import load_checkpoint, load_fitting_weights
from patchword.config import apply_overrides, from_dict
from patchword.device import resolve_device
from patchword.errors import MissingFileError
from patchword.hashing.build import (
    build_hashing_dataset,
    build_hashing_model,
    refuse_ignored_keys,
    refuse_resplit,
)
from patchword.hashing.config import HashRunConfig, check_hash_config, override_keys
from patchword.hashing.dataset import HashDataset
from patchword.hashing.model import UCMFH
from patchword.hashing.rundir import (
    check_evaluated_data,
    read_hash_run_config,
    recorded_data_location,
    refuse_missing_run_data,
    refuse_trained_run_overrides,
)
from patchword.hashing.runstate import checkpoint_record, imported_untrained, refuse_imported_without_data
from patchword.hashing.usedkeys import check_used_keys
from patchword.runs.files import LAST_CHECKPOINT

__all__ = ["HashRun", "open_hashing_run", "load_hashing_run"]


@dataclass
class HashRun:
    """A trained run loaded back: config (with the overrides applied), model (eval mode, on
    ``cfg.device``), data, and :func:`checkpoint_record` of the weights."""

    cfg: HashRunConfig
    model: UCMFH
    data: HashDataset
    checkpoint: dict[str, Any]


def open_hashing_run(
    run_dir: str | Path,
    overrides: Sequence[str] | None = None,
    device: str | None = None,
    *,
    unimodal: str = "",
    check: Callable[[HashRunConfig], None] | None = None,
    command: str = "hash eval",
) -> HashRun:
    """Config, trained model, dataset and checkpoint record of a run (see :func:`load_hashing_run`);
    ``unimodal``: why the caller needs a unimodal model, said (ValueError) before the data are read;
    ``check``: the caller's own check of the run's config (with the overrides), also made before;
    ``command``: the verb that opens the run (``hash search``), which a re-split refusal names."""
    run_dir = Path(run_dir)
    saved = read_hash_run_config(run_dir)
    if not (run_dir / LAST_CHECKPOINT).is_file():
        raise MissingFileError(f"{run_dir} has no last.pt: the run never saved a checkpoint")
    refuse_trained_run_overrides(overrides or [])
    given = override_keys(overrides or [])
    cfg = apply_overrides(saved, list(overrides or []))  # a copy: ``saved`` stays the run's own
    cfg = replace(
        cfg, device=str(resolve_device(device or cfg.device, key="--device" if device else "device"))
    )
    # the overridden eval / data keys get the checks training made (eval.topk=0 reported map@0 = 0.0)
    check_hash_config(cfg)
    if unimodal and cfg.model.fusion != "unimodal":
        raise ValueError(unimodal)
    if check is not None:
        check(cfg)
    # an override the run's settings never read (model.eval_batch_size on a unimodal run) is refused as a
    # new run's is; the values its config.yaml holds are the run's, not the command's
    check_used_keys(cfg, given, only_given=True)
    # refused before the data are read or built (minutes on real data): a data key the overrides set that
    # the run's format would ignore (a split key for a split directory, a data.synthetic_* key for files...;
    # the run's own are not), then one that re-splits the run's data
    refuse_ignored_keys(cfg.data, given)
    state = load_checkpoint(run_dir / LAST_CHECKPOINT, map_location=cfg.device)
    # the config of the session that wrote last.pt, parsed once: where its data were (a resume that found
    # them moved recorded the new place there; config.yaml is never rewritten) and the epochs it trained to
    session = from_dict(HashRunConfig, state["config"]) if state.get("config") else None
    recorded = session.data if session is not None else None
    saved = replace(saved, data=recorded_data_location(saved.data, recorded)[0])
    located, source = recorded_data_location(cfg.data, recorded, given)
    cfg = replace(cfg, data=located)
    # an imported checkpoint not trained on since has no data of its own
    trained = not imported_untrained(run_dir, int(state["step"]))
    if trained:
        # weights trained on the run's split: another split (or synthetic set) of the same data put
        # training pairs in the query set
        refuse_resplit(saved.data, cfg.data, command=command)
    else:  # its config.yaml's synthetic stand-in is no data to evaluate it on, unless asked
        refuse_imported_without_data(run_dir, saved.data, given)
    refuse_missing_run_data(cfg.data, run_dir, given, run_dir / source)
    # the training split is unused here: a capped default data.num_train is no news (said at training)
    data = build_hashing_dataset(cfg.data, given, training=False)
    if trained:  # a copy of the run's data re-split, or its files changed since (rows added)
        check_evaluated_data(state, data, saved.data, cfg.data, run_dir, command)
    model = build_hashing_model(cfg.model, data.image_dim, data.text_dim)
    # data (overridden, or its files replaced) with other feature sizes build a model the weights do not fit
    builds = f"these data build (image {data.image_dim}-d, text {data.text_dim}-d)"
    load_fitting_weights(model, state["model"], run_dir / LAST_CHECKPOINT, "data", builds)
    # the epochs the session that wrote it trained to (a resume may have raised config.yaml's)
    epochs = session.train.epochs if session is not None else cfg.train.epochs
    checkpoint = checkpoint_record(
        run_dir, int(state["epoch"]), int(state.get("batch_in_epoch", 0)), int(state["step"]), int(epochs)
    )
    return HashRun(cfg, model.to(cfg.device).eval(), data, checkpoint)


def load_hashing_run(
    run_dir: str | Path, overrides: list[str] | None = None, device: str | None = None
) -> tuple[HashRunConfig, UCMFH, HashDataset]:
    """Config, trained model (eval mode, on the config's or the given device) and dataset of a run.

    ``overrides`` may change only the keys in :data:`HASH_EVAL_KEYS` (evaluation options, the device, the
    data): the run's model is its own. The overridden config is checked as training checks it.

    Raises:
        MissingFileError: ``run_dir`` has no ``config.yaml`` or no ``last.pt``.
        ConfigError: an override of another key, a value out of range, data whose feature sizes do not
            fit the trained weights, or a split / synthetic key re-splitting the run's own data; an
            imported checkpoint without data of its own unless ``data.format`` is given.
    """
    run = open_hashing_run(run_dir, overrides, device)
    return run.cfg, run.model, run.data
