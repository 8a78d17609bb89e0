"""A hashing run directory while a command trains it: the :class:`~patchword.runs.claim.RunKind` of
``patchword hash train``, which follows the rules of every training command's run directories (claimed by
one new run, locked against a second command, removed again when the start fails before its first
checkpoint, cleared of what a killed start or write left: :mod:`patchword.runs.claim`).

The data of a run: its config.yaml names them by absolute paths (:func:`absolute_data`) and its last.pt
records their rows and sha256 (:func:`~patchword.hashing.build.data_fingerprint`), so a resume or an
evaluation tells the run's data from changed ones (rows added, contents replaced) wherever they lie
(:func:`check_resumed_data`, :func:`check_evaluated_data`); a file the run names that is gone is said with
the key that points at it (:func:`refuse_missing_run_data`). config.yaml is never rewritten: where a resume
found the data moved is in its last.pt, which every later command reads (:func:`recorded_data_location`).
Corrected labels for the run's own features are evaluated and recorded, labels added or dropped are refused
(:func:`check_evaluated_data`), and so is a run an older version split row by row over data whose rows
repeat an image (split by image now).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from patchword.config import apply_overrides, config_from_mapping, flat_config, refuse_overrides
from patchword.errors import ConfigError, MissingFileError
from patchword.hashing.build import SOURCE_KEYS, changed_data_parts, refuse_resplit, resolved_data_path
from patchword.hashing.config import (
    DATA_SOURCE_FORMATS,
    HASH_EVAL_KEYS,
    HASH_RESUME_DATA_KEYS,
    HashDataConfig,
    HashRunConfig,
    saved_run_config,
)
from patchword.hashing.dataset import HashDataset
from patchword.runs.claim import LOCK_FILE, Refusals, RunKind
from patchword.runs.files import CONFIG_FILE, LAST_CHECKPOINT, METRICS_FILE, RESUMES_FILE, WEIGHTS_FILE
from patchword.runs.load import read_run_mapping, refuse_run_output

__all__ = [
    "HASH_RUNS",
    "HASH_RUN_FILES",
    "refuse_run_outputs",
    "absolute_data",
    "check_evaluated_data",
    "check_resumed_data",
    "read_hash_run_config",
    "recorded_data_location",
    "refuse_missing_run_data",
    "refuse_trained_run_overrides",
]

_logger = logging.getLogger(__name__)

#: Start files: what a start writes before its first ``last.pt`` (metrics.jsonl: the records of epochs
#: nobody can resume); start temps: the files it writes atomically by then. Atomic files: every file a run
#: writes atomically, the export (model.safetensors, config.json) in the run directory itself.
HASH_RUNS = RunKind(
    command="patchword hash train",
    start_files=(LOCK_FILE, CONFIG_FILE, METRICS_FILE),
    start_temps=(CONFIG_FILE, LAST_CHECKPOINT),
    atomic_files=(
        CONFIG_FILE,
        LAST_CHECKPOINT,
        METRICS_FILE,
        RESUMES_FILE,
        "eval.json",
        WEIGHTS_FILE,
        "config.json",
    ),
    refusals=Refusals(
        resumable="{run_dir} already holds a run; continue it with {resume} or choose another --name",
        stopped=(
            f"{{run_dir}} already holds a run that stopped before its first checkpoint ({CONFIG_FILE}, no "
            f"{LAST_CHECKPOINT}) with files a start does not write: nothing to --resume; remove it or choose "
            "another --name"
        ),
        foreign=(
            "{run_dir} already holds files of something else: nothing to --resume; remove it or choose "
            "another --name"
        ),
        is_file="{run_dir} is a file: choose another --name or --output-dir",
    ),
    logger=__name__,
)


#: The files of a hashing run directory: what ``hash train`` writes and the database indexes ``hash search``
#: caches there. No output of a command that reads the run replaces one, ``--force`` or not.
HASH_RUN_FILES = frozenset(
    {*HASH_RUNS.start_files, *HASH_RUNS.atomic_files, "index_image.npz", "index_text.npz"}
)


def read_hash_run_config(run_dir: Path) -> HashRunConfig:
    """A hashing run's own config: its ``config.yaml``, read once, as this version reads it
    (:func:`~patchword.hashing.config.saved_run_config`).

    Raises:
        MissingFileError: ``run_dir`` has no config.yaml.
        DataError: the file is empty or a retrieval run's (each of its keys was "unknown config key").
        ConfigError: a key or a value a :class:`HashRunConfig` refuses, naming the file.
    """
    if not (run_dir / CONFIG_FILE).is_file():
        raise MissingFileError(f"{run_dir} is not a hashing run directory (no {CONFIG_FILE})")
    mapping = read_run_mapping(run_dir, kind="hashing")
    return saved_run_config(config_from_mapping(HashRunConfig, mapping, run_dir / CONFIG_FILE))


def refuse_run_outputs(
    run_dir: str | Path,
    outputs: dict[str, Path | None],
    reads: Sequence[str | Path] = (),
    cfg: HashRunConfig | None = None,
) -> None:
    """Before any work: no file a command writes (``outputs``: flag -> path, None where not given) is one
    of the files of the run (:data:`HASH_RUN_FILES`, any checkpoint), one of ``reads`` (a query file) or,
    once the run's ``cfg`` is read, a feature file of its data section (``data.image``, ``data.text``,
    ``data.labels``, ``data.root`` or a file in it): ``hash eval RUN --out RUN/last.pt --force`` wrote the
    metrics over the checkpoint.

    Raises:
        ConfigError: naming the flag.
    """
    data = (
        [Path(v) for v in (cfg.data.image, cfg.data.text, cfg.data.labels, cfg.data.root) if v] if cfg else []
    )
    reads = [*reads, *data, *(f for path in data if path.is_dir() for f in path.iterdir())]
    for flag, path in outputs.items():
        if path is not None:
            refuse_run_output(path, [run_dir], reads, names=HASH_RUN_FILES, flag=flag)


def absolute_data(dc: HashDataConfig) -> HashDataConfig:
    """``dc`` with ``data.image`` / ``data.text`` / ``data.labels`` / ``data.root`` absolute: what a run
    records, so that its commands read the same files from any working directory."""
    keys = [key for key in DATA_SOURCE_FORMATS if getattr(dc, key.removeprefix("data."))]
    return replace(dc, **{key.removeprefix("data."): resolved_data_path(dc, key) for key in keys})


def recorded_data_location(
    dc: HashDataConfig, recorded: HashDataConfig | None, given: Collection[str] = ()
) -> tuple[HashDataConfig, str]:
    """``dc`` (a run's config.yaml data section, with a command's overrides) with each data path
    (:data:`HASH_RESUME_DATA_KEYS`) that ``given`` does not set taken from ``recorded``, the data section of
    the run's last.pt: a resume that found the data moved (``data.image=NEW``) recorded the new place
    there, and config.yaml is never rewritten. Returns the section and the run file its paths come from
    (last.pt when any came from ``recorded``, else config.yaml), which errors name. ``recorded`` None (no
    config in last.pt): ``dc`` as it is."""
    if recorded is None:
        return dc, CONFIG_FILE
    keys = [key.removeprefix("data.") for key in sorted(HASH_RESUME_DATA_KEYS - set(given))]
    moved = {key: getattr(recorded, key) for key in keys if getattr(recorded, key) != getattr(dc, key)}
    return replace(dc, **moved), LAST_CHECKPOINT if moved else CONFIG_FILE


def refuse_missing_run_data(
    dc: HashDataConfig, run_dir: Path, given: Collection[str], source: Path | None = None
) -> None:
    """Before the data are read: a data file (or ``data.root``) that the run's config.yaml (or ``source``,
    the last.pt of a resume that moved them) names, and that no override in ``given`` replaces, exists; a
    moved one is said with the key that points at it.

    Raises:
        ConfigError: naming the key, the path and the run's config.yaml.
    """
    for key, formats in DATA_SOURCE_FORMATS.items():
        value = getattr(dc, key.removeprefix("data."))
        if key in given or dc.format not in formats or not value:
            continue
        if not Path(value).expanduser().exists():
            raise ConfigError(
                key, f"{value} does not exist (from {source or run_dir / CONFIG_FILE}); point {key}=NEW at it"
            )


def _named(dc: HashDataConfig, parts: list[str]) -> str:
    """The files of the fingerprint ``parts`` (``data.image (/d/img.npy)``, ``data.root (train split)``)."""
    named = []
    for part in parts:
        if part.startswith("data."):
            named.append(f"{part} ({getattr(dc, part.removeprefix('data.'))})")
        else:
            named.append(f"data.root ({dc.root}: {part} split)")
    return ", ".join(named)


def _key(parts: list[str]) -> str:
    return parts[0] if parts[0].startswith("data.") else "data.root"


def check_resumed_data(
    state: dict[str, Any], data: HashDataset, dc: HashDataConfig, run_dir: Path, moved: Collection[str]
) -> None:
    """A resume trains on the data the run trained on (bit-for-bit resume): the fingerprint of ``data``
    (read from ``dc``) equals the one its last.pt ``state`` recorded. ``moved``: the data keys the resume
    points elsewhere, accepted only so. A last.pt of an older version records none: the run's paths are
    trusted, as they were, and a moved one is refused (nothing to check it against). Data built in code
    (no fingerprint) are the caller's.

    Raises:
        ConfigError: naming the changed data files, or a moved key a run without a fingerprint cannot check.
    """
    recorded, read = state.get("data_fingerprint"), data.info.get("fingerprint")
    if recorded is None:
        if moved:
            key = sorted(moved)[0]
            raise ConfigError(
                key,
                f"{run_dir / LAST_CHECKPOINT} records no fingerprint of its data (an older version saved "
                "it): a resume cannot check that the data there are the run's; drop it",
            )
        _logger.debug("%s records no fingerprint of its data: not compared", run_dir / LAST_CHECKPOINT)
        return
    changed = []
    if read is not None:
        changed = changed_data_parts(recorded, read)
        _refuse_other_split_unit(recorded, read, [part for part in changed if part != "data.labels"], run_dir)
    if changed:
        raise ConfigError(
            _key(changed),
            f"{_named(dc, changed)} differ(s) from the data {run_dir} trained on (rows / sha256 recorded in "
            f"{LAST_CHECKPOINT}): a resumed run trains on its own data; restore them (or point "
            f"{_key(changed)}=... at them) or train a new run",
        )


def check_evaluated_data(
    state: dict[str, Any],
    data: HashDataset,
    run: HashDataConfig,
    dc: HashDataConfig,
    run_dir: Path,
    command: str = "hash eval",
) -> None:
    """``command`` (``hash eval`` / ``hash search``, which a refusal names) once the data ``dc`` (the run's
    data section ``run`` with the overrides) were read: a copy of the run's data is its data (a split key
    other than the run's is refused, :func:`~patchword.hashing.build.refuse_resplit`); the run's own
    features with other contents (rows added) and the run's split keys would split other pairs into the
    query set, which may then hold pairs it trained on: refused. Other data given on purpose are marked
    ``same_data_as_run: false`` in the data block (``data.info``). Other labels for the run's own features
    (``data.labels=FIXED.npy``) are evaluated: the split is a permutation of the rows, whatever the labels
    say; the data block records the file and its sha256 (``labels_other_than_run``). Labels added or
    dropped (``data.labels=``) are refused: whether there are labels decides the split (labelled: the
    retrieval set is every pair the queries leave; pair-only: the query pairs themselves). A last.pt
    without a fingerprint: the paths decided (before reading).

    Raises:
        ConfigError: naming the key and the changed files, the re-splitting key, or labels added / dropped.
    """
    recorded, read = state.get("data_fingerprint"), data.info.get("fingerprint")
    if recorded is None or read is None:
        return
    changed = changed_data_parts(recorded, read)
    features = [part for part in changed if part != "data.labels"]  # the split's rows: features alone
    _refuse_other_split_unit(recorded, read, features, run_dir)
    refuse_resplit(run, dc, same_data=not features, command=command)
    if not changed:
        return
    own_files = all(resolved_data_path(run, key) == resolved_data_path(dc, key) for key in SOURCE_KEYS)
    if own_files and not features:  # the run's features, other labels
        _other_labels(recorded, read, data, dc, run_dir)
        return
    if own_files and "split_seed" in data.info:  # split here, by the run's split keys
        verb = "search" if command.endswith("search") else "evaluate"
        raise ConfigError(
            _key(features),
            f"{_named(dc, features)} changed since {run_dir} trained on it (rows / sha256 recorded in "
            f"{LAST_CHECKPOINT}): the run's split of these pairs may put pairs it trained on in the query "
            f"set; restore the data, or {verb} other data on purpose (point data.image / data.text / "
            "data.root at them)",
        )
    if own_files:  # pre-split files: their own splits, but not what the run was evaluated on
        _logger.warning("%s differ(s) from the data %s trained on", _named(dc, changed), run_dir)
    data.info["same_data_as_run"] = False


def _other_labels(
    recorded: dict[str, Any], read: dict[str, Any], data: HashDataset, dc: HashDataConfig, run_dir: Path
) -> None:
    """The run's own features with a labels file of other contents: evaluated, and recorded in the data
    block; labels added to a run without or dropped from a run with them are refused (see
    :func:`check_evaluated_data`)."""
    old, new = recorded["sha256"].get("data.labels"), read["sha256"].get("data.labels")
    if old is not None and new is None:
        raise ConfigError(
            "data.labels",
            f"{'is empty' if not dc.labels else 'gives no labels'}, but {run_dir} trained on labelled pairs "
            f"(sha256 {old[:12]}... in {LAST_CHECKPOINT}): without labels the split is another (pair-only "
            "data: the query pairs are the retrieval set) and the metrics another protocol; give the run's "
            "labels file or corrected labels (data.labels=FILE)",
        )
    if old is None:
        raise ConfigError(
            "data.labels",
            f"{run_dir} trained on pairs without labels: with labels the split is another (labelled data: "
            "the retrieval set is every pair the queries leave, not the query pairs) than the run's; train "
            "a run with data.labels given to evaluate with labels (the contrastive losses do not read them)",
        )
    labels = resolved_data_path(dc, "data.labels")
    _logger.info("%s: labels other than those %s trained with (sha256 %s...)", labels, run_dir, new[:12])
    data.info["labels_other_than_run"] = {"file": labels, "sha256": new, "run_sha256": old}


def _refuse_other_split_unit(
    recorded: dict[str, Any], read: dict[str, Any], features: list[str], run_dir: Path
) -> None:
    """Data whose rows repeat an image are split by image (``split_by`` in the fingerprint); a run of them
    an older version split row by row had other splits, its query set holding images it trained on.
    ``features``: the parts other than ``data.labels`` whose rows or contents differ from ``recorded``."""
    if read.get("split_by") != recorded.get("split_by") and not features:
        raise ConfigError(
            "data",
            f"{run_dir} was trained by an older version that split these data row by row although rows "
            f"repeat an image (one per caption): its query images were training images too (the split is "
            "by image now); train a new run",
        )


def refuse_trained_run_overrides(
    overrides: Sequence[str], takes: str = "data.*, eval.*, device or model.eval_batch_size"
) -> None:
    """Before anything is read: an override of a key outside :data:`HASH_EVAL_KEYS` is refused, naming it
    (``model.bits=16`` on a 32-bit run would build a model its weights do not fit) and what the verb does
    take (``takes``); an unknown key is named as one (``frob=1`` was said to be a key that "cannot
    change")."""
    known = flat_config(HashRunConfig())
    for item in overrides:
        if "=" in item and item.split("=", 1)[0].strip() not in known:
            apply_overrides(HashRunConfig(), [item])  # raises: the unknown key, and the closest valid one
    refuse_overrides(
        overrides,
        HASH_EVAL_KEYS,
        "cannot change on a trained run (its weights fix the model; train.* changes only training): "
        f"override {takes}",
    )
