"""``patchword export RUN OUT``: a trained (or imported) run as a self-describing model directory.

The directory holds what using the model needs and nothing of its training: ``model.safetensors`` (the
weights of the run's best checkpoint), ``config.yaml`` (the resolved run config), the tokenizer
(``vocab.json`` or ``bert_vocab.txt``), ``backbones.json`` (Hugging Face architectures, so nothing is
downloaded), ``metrics.json`` (what the run measured, and the sha256 of ``model.safetensors``, which
:func:`~patchword.runs.load.load_run` checks) and a ``README.md`` model card generated from the run
(:mod:`patchword.runs.card`: family, variant, each encoder and where its weights came from, training data,
the exported checkpoint's step beside the run's, the evaluation of that checkpoint with its split, gallery
size and protocol, leaky or not, the hash of the exported ``config.yaml``, patchword version; for an
imported official checkpoint, the published results of its method beside the numbers measured here). The
checkpoint must be a file of the run: the directory pairs it with the run's config, vocabulary and training
record.

An exported directory can be exported again. Its ``model.safetensors`` records no training step and the
directory no evaluation file, but its ``metrics.json`` holds both for the weights it wrote (their sha256):
while the file still holds those weights, the new export carries the step, the run they were exported from
and, when the directory has no evaluation of its own and its ``config.yaml`` is the one the export wrote,
that evaluation, labelled as the one recorded by the export it was made from. Refusing would only send the
user back to a source run that may be gone; the digest proves the numbers are of these weights.

``patchword.runs.load_run(OUT)`` and ``patchword.create_model(OUT)`` load it offline; a Hugging Face hub id
of such a directory resolves through the local cache (``create_model("hf-hub:user/name")``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from safetensors.torch import save

from patchword.errors import ConfigError, DataError, RunExistsError
from patchword.fileio import atomic_write_bytes, atomic_write_text, probe_writable, staging_dir
from patchword.readers import read_json
from patchword.runs.card import CARD_KEYS, model_card
from patchword.runs.files import (
    BACKBONES_FILE,
    BERT_VOCAB_DIR,
    CONFIG_FILE,
    IMPORT_FILE,
    METRICS_JSON,
    SUMMARY_FILE,
    VOCAB_FILE,
    WEIGHTS_FILE,
)
from patchword.runs.load import (
    WEIGHTS_DIGEST_KEY,
    config_hash,
    load_run,
    read_run_mapping,
    resolve_checkpoint,
)
from patchword.runs.origins import warm_start_counts
from patchword.runs.recorded import checkpoint_facts, evaluation_of, path_in_run
from patchword.version import __version__

__all__ = ["export_run", "model_card", "carries_evaluation"]

_COPIED = (CONFIG_FILE, VOCAB_FILE, BACKBONES_FILE, IMPORT_FILE)


def export_run(run_dir: str | Path, out: str | Path, checkpoint: str | Path | None = None) -> Path:
    """Write the model directory ``out`` of ``run_dir`` (atomically: a temporary directory renamed).

    Raises:
        RunExistsError: ``out`` exists.
        MissingFileError: ``run_dir`` is not a run directory (a file, no such directory, no config.yaml),
            or lacks the checkpoint.
        DataError: the run's config.yaml is empty or a hashing run's; the evaluation the card would show
            records a recall that is not a number or a ``leaky`` that is not true / false.
        ConfigError: ``checkpoint`` is not a file of ``run_dir`` (``--checkpoint``).
    """
    run_dir, out = Path(run_dir), Path(out)
    if out.exists():
        raise RunExistsError(f"{out} exists; choose another directory (an export is never overwritten)")
    read_run_mapping(run_dir)  # the run directory first: "nope/best.pt does not exist in nope" named none
    path = _own_checkpoint(run_dir, checkpoint)
    probe_writable(out.parent)
    run = load_run(run_dir, path)
    tensors = {k: v.detach().cpu().contiguous() for k, v in run.model.state_dict().items()}
    # the evaluation of the exported checkpoint (summary.json describes best.pt, eval_*.json name theirs)
    metrics, source = evaluation_of(run_dir, run.checkpoint, run.config.eval.split)
    earlier = _earlier_export(run_dir, run.checkpoint)
    carried = not metrics and carries_evaluation(earlier, run_dir)
    if carried:
        metrics, source = earlier["metrics"], METRICS_JSON
    where = f"{run_dir / str(source)}" + (", metrics" if carried else "")
    _check_recalls(metrics, where)
    training = _read_json(run_dir / SUMMARY_FILE)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(staging_dir(out, "export"))
    try:
        for name in _COPIED:
            if (run_dir / name).is_file():
                shutil.copyfile(run_dir / name, tmp / name)
        if run.config.data.tokenizer == "bert":  # the vocabulary travels with the model
            run.tokenizer.save(tmp / BERT_VOCAB_DIR)
            _set_bert_vocab(tmp / CONFIG_FILE)
        weights = save(tensors)
        atomic_write_bytes(tmp / WEIGHTS_FILE, weights)
        record = {
            "patchword_version": __version__,
            "source_run": str(run_dir),
            "checkpoint": path_in_run(run_dir, run.checkpoint).as_posix(),
            # the training step the exported weights were saved at; the run may have trained longer
            "checkpoint_step": checkpoint_facts(run.checkpoint).get("step"),
            "run_steps": training.get("steps"),
            # this directory's config.yaml (the BERT vocabulary path is rewritten to the copy in it) and
            # the source run's, with which the evaluation below was made
            "config_hash": config_hash(tmp),
            "source_config_hash": config_hash(run_dir),
            "metrics": metrics,
            "metrics_source": source,
            # what train.init_from supplied: training's record of it (runs trained before it: counted now)
            "warm_start": _warm_start(run, tensors),
            # the digest of this directory's model.safetensors (``metrics.checkpoint_sha256`` is the source
            # checkpoint's): load_run checks it, as safetensors keeps no checksum of its own
            WEIGHTS_DIGEST_KEY: hashlib.sha256(weights).hexdigest(),
        }
        if earlier is not None:
            record.update(_carried_facts(earlier, record, carried))
        atomic_write_text(tmp / METRICS_JSON, json.dumps(record, indent=2))
        atomic_write_text(tmp / "README.md", model_card(run, record))
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _warm_start(run, tensors: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`~patchword.runs.origins.warm_start_counts` of the run's ``train.init_from`` (None without one,
    and for an imported run, whose every tensor is the official checkpoint's)."""
    init_from = run.config.train.init_from
    if not init_from or (run.run_dir / IMPORT_FILE).is_file():
        return None
    return warm_start_counts(tensors, init_from, run_dir=run.run_dir)


def _earlier_export(run_dir: Path, checkpoint: Path) -> dict[str, Any] | None:
    """The ``metrics.json`` of ``run_dir`` when it is an exported model directory whose
    ``model.safetensors`` is ``checkpoint`` and still holds the weights that export wrote (the sha256 it
    recorded); None otherwise (a training run's ``metrics.json`` records no weights digest)."""
    if path_in_run(run_dir, checkpoint) != Path(WEIGHTS_FILE):
        return None
    record = read_json(run_dir / METRICS_JSON, f"export record ({METRICS_JSON})", default={})
    digest = record.get(WEIGHTS_DIGEST_KEY) if isinstance(record, dict) else None
    if not isinstance(digest, str):  # a recorded digest: load_run checked the file against it
        return None
    return record


def carries_evaluation(earlier: dict[str, Any] | None, run_dir: Path) -> bool:
    """Whether the evaluation an earlier export recorded still describes ``run_dir`` as configured: it
    recorded one, and the directory's ``config.yaml`` is the one that export wrote (its hash)."""
    if earlier is None or not isinstance(earlier.get("metrics"), dict) or not earlier["metrics"]:
        return False
    return earlier.get("config_hash") == config_hash(run_dir)


def _carried_facts(earlier: dict[str, Any], record: dict[str, Any], carried: bool) -> dict[str, Any]:
    """What an export of an exported directory takes from the ``metrics.json`` of the export it was made
    from (same weights, by their sha256): the run and checkpoint they were first exported from, its step
    and the run's steps where this directory has none, its warm-start counts (the file may be gone now)
    and, with ``carried``, where its evaluation was made."""
    origin = earlier.get("origin")
    if not isinstance(origin, dict):
        origin = {"run": earlier.get("source_run"), "checkpoint": earlier.get("checkpoint")}
    facts: dict[str, Any] = {"origin": origin}
    for key in ("checkpoint_step", "run_steps"):
        if record.get(key) is None and earlier.get(key) is not None:
            facts[key] = earlier[key]
    counted = earlier.get("warm_start")
    if (
        not (record.get("warm_start") or {}).get("tensors")
        and isinstance(counted, dict)
        and counted.get("tensors")
    ):
        facts["warm_start"] = counted  # counted when the file was there
    if carried:
        made = earlier.get("metrics_origin")
        facts["metrics_origin"] = (
            made
            if isinstance(made, dict)
            else {
                "run": earlier.get("source_run"),
                "file": earlier.get("metrics_source"),
                "config_hash": earlier.get("source_config_hash"),
            }
        )
    return facts


def _check_recalls(metrics: dict[str, Any], where: str) -> None:
    """The recall figures of the evaluation the card shows are numbers, and its ``leaky`` flag (the
    protocol the card names) is true or false (before anything is written).

    Raises:
        DataError: naming ``where`` (the record they come from) and the first field that is neither.
    """
    for key in CARD_KEYS:
        value = metrics.get(key)
        if key in metrics and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise DataError(f"{where}: {key} is {json.dumps(value)}, not a number")
    if "leaky" in metrics and not isinstance(metrics["leaky"], bool):
        raise DataError(f"{where}: leaky is {json.dumps(metrics['leaky'])}, not true or false")


def _own_checkpoint(run_dir: Path, checkpoint: str | Path | None) -> Path:
    """The checkpoint file of ``run_dir`` an export takes (``best.pt`` by default; a relative name is looked
    up in the run first).

    Raises:
        MissingFileError: no such checkpoint.
        ConfigError: the file lies outside ``run_dir``. An export pairs the weights with the run's config,
            vocabulary and training record, and its card with the run's evaluations: weights of another run
            would be described as this one's (and a word vocabulary would index other embeddings).
    """
    relative = checkpoint is not None and not Path(checkpoint).is_absolute()
    if relative and (run_dir / checkpoint).is_file():
        path = run_dir / checkpoint
    else:
        path = resolve_checkpoint(run_dir, checkpoint)
    if path_in_run(run_dir, path) is None:
        raise ConfigError(
            "--checkpoint",
            f"{path} is not a file of {run_dir}: an export describes the run's own checkpoints (its config, "
            "vocabulary and evaluations); export the run that checkpoint belongs to",
        )
    return path


def _read_json(path: Path) -> dict[str, Any]:
    return read_json(path, path.name, default={})


def _set_bert_vocab(config: Path) -> None:
    """Point the exported config's ``data.bert_vocab`` at the copied vocabulary (relative to the dir)."""
    import yaml

    data = yaml.safe_load(config.read_text())
    data["data"]["bert_vocab"] = BERT_VOCAB_DIR
    atomic_write_text(config, yaml.safe_dump(data, sort_keys=False))
