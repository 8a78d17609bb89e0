"""``patchword export RUN OUT``: a trained (or imported) run as a self-describing model directory.

The directory holds what using the model needs and nothing of its training: ``model.safetensors`` (the
weights of the run's best checkpoint), ``config.yaml`` (the resolved run config), the tokenizer
(``vocab.json`` or ``bert_vocab.txt``), ``backbones.json`` (Hugging Face architectures, so nothing is
downloaded), ``metrics.json`` (what the run measured, and the sha256 of ``model.safetensors``, which
:func:`~patchword.runs.load.load_run` checks) and a ``README.md`` model card generated from the run
(family, variant, backbones, training data, the exported checkpoint's step beside the run's, the evaluation
of that checkpoint with its split, gallery size and protocol, leaky or not, the hash of the exported
``config.yaml``, patchword version; for an imported official checkpoint, the published results of its method
beside the numbers measured here, from :mod:`patchword.imports.published`). The checkpoint must be a file of
the run: the directory pairs it with the run's config, vocabulary and training record.
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
from patchword.imports import published as published_table
from patchword.matching import matcher_spec
from patchword.model import matcher_arguments
from patchword.readers import read_json
from patchword.runs.files import (
    BACKBONES_FILE,
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
from patchword.runs.recorded import checkpoint_facts, evaluation_of, path_in_run
from patchword.version import __version__

__all__ = ["export_run", "model_card"]

_COPIED = (CONFIG_FILE, VOCAB_FILE, BACKBONES_FILE, IMPORT_FILE)
BERT_VOCAB_DIR = "bert_vocab"  # vocab.txt + tokenizer_config.json: what BertCaptionTokenizer reads


def export_run(run_dir: str | Path, out: str | Path, checkpoint: str | Path | None = None) -> Path:
    """Write the model directory ``out`` of ``run_dir`` (atomically: a temporary directory renamed).

    Raises:
        RunExistsError: ``out`` exists.
        MissingFileError: ``run_dir`` is not a run directory (a file, no such directory, no config.yaml),
            or lacks the checkpoint.
        DataError: the run's config.yaml is empty or a hashing run's.
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
    _check_recalls(metrics, run_dir / str(source))
    training = _read_json(run_dir / SUMMARY_FILE)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(staging_dir(out, "export"))
    try:
        for name in _COPIED:
            if (run_dir / name).is_file():
                shutil.copyfile(run_dir / name, tmp / name)
        if run.config.data.tokenizer == "bert":  # the vocabulary travels with the model
            _write_bert_vocab(run.tokenizer, tmp / BERT_VOCAB_DIR)
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
            # the digest of this directory's model.safetensors (``metrics.checkpoint_sha256`` is the source
            # checkpoint's): load_run checks it, as safetensors keeps no checksum of its own
            WEIGHTS_DIGEST_KEY: hashlib.sha256(weights).hexdigest(),
        }
        atomic_write_text(tmp / METRICS_JSON, json.dumps(record, indent=2))
        atomic_write_text(tmp / "README.md", model_card(run, record))
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


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


def _write_bert_vocab(tokenizer, directory: Path) -> None:
    """The BERT tokenizer's vocabulary (``vocab.txt`` in id order) and its casing."""
    words = sorted(tokenizer.vocab, key=tokenizer.vocab.__getitem__)
    directory.mkdir()
    atomic_write_text(directory / "vocab.txt", "".join(f"{w}\n" for w in words))
    atomic_write_text(
        directory / "tokenizer_config.json", json.dumps({"do_lower_case": bool(tokenizer.do_lower_case)})
    )


def _set_bert_vocab(config: Path) -> None:
    """Point the exported config's ``data.bert_vocab`` at the copied vocabulary (relative to the dir)."""
    import yaml

    data = yaml.safe_load(config.read_text())
    data["data"]["bert_vocab"] = BERT_VOCAB_DIR
    atomic_write_text(config, yaml.safe_dump(data, sort_keys=False))


#: The recall figures the model card shows, in its column order.
_CARD_KEYS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum")


def _check_recalls(metrics: dict[str, Any], path: Path) -> None:
    """The recall figures of the evaluation the card shows are numbers (before anything is written).

    Raises:
        DataError: naming ``path`` (the record they come from) and the first field that is not a number.
    """
    for key in _CARD_KEYS:
        value = metrics.get(key)
        if key in metrics and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise DataError(f"{path}: {key} is {json.dumps(value)}, not a number")


def _reported(mc) -> dict[str, Any]:
    """The option fields the matcher's registration reports (SEPS / LAPS: ``variant``) and their values."""
    options = {**matcher_spec(mc.matcher).preset, **matcher_arguments(mc)}
    return {key: options[key] for key in matcher_spec(mc.matcher).report}


def model_card(run, record: dict[str, Any]) -> str:
    """The ``README.md`` of an exported model: what it is, how it was trained, what it scored and how."""
    cfg, model = run.config, run.model
    mc, dc, tc = cfg.model, cfg.data, cfg.train
    metrics = record.get("metrics") or {}
    imported = _read_json(run.run_dir / IMPORT_FILE)
    backbones = {
        "image": mc.hf_vision
        if mc.image_encoder == "hf"
        else f"{mc.image_encoder} ({mc.tiny_pretrained or 'from scratch'})",
        "text": mc.hf_text if mc.text_encoder == "bert" else mc.text_encoder,
    }
    reads_dense = model.matcher.consumes_dense and dc.dense
    dense = f"yes, tied to the {model.matcher.dense_pairing}" if reads_dense else "no"
    lines = [
        f"# {run.run_dir.name}",
        "",
        f"A patchword model: `{mc.matcher}`"
        + (f" (`{mc.name}`)" if mc.name else "")
        + f" over {backbones['image']} image tokens and {backbones['text']} text tokens, "
        f"{mc.embed_dim}-d joint space.",
        "",
        "```python",
        "from patchword.runs import load_run",
        "run = load_run('.')          # model, tokenizer, image preprocessing; no download",
        "```",
        "",
        "## Model",
        "",
        f"* matcher: `{mc.matcher}`" + "".join(f", {key} `{value}`" for key, value in _reported(mc).items()),
        f"* image encoder: {backbones['image']}; text encoder: {backbones['text']}",
        f"* patches: {model.image_encoder.num_patches}, CLS token: {model.image_encoder.has_cls}",
        f"* dense text: {dense}",
        "",
        "## Training",
        "",
    ]
    if imported:
        lines += [
            f"Imported from an official {imported.get('family')} checkpoint: `{imported.get('source')}` "
            f"(sha256 `{str(imported.get('source_sha256', ''))[:16]}`), {imported.get('loaded')} tensors "
            f"loaded, {len(imported.get('ignored', {}))} ignored"
            + (f", {len(imported['derived'])} built from its options" if imported.get("derived") else "")
            + " (listed in `import.json`).",
        ]
    else:
        data = dc.dataset + (
            f" ({dc.synthetic_scenes} scenes, {dc.num_train} training images)"
            if dc.dataset == "synthetic"
            else f" ({dc.root})"
        )
        lines += [
            f"* data: {data}",
            _steps_line(record),
            f"* batch {tc.batch_size}, lr {tc.lr}, loss {tc.loss}, precision {cfg.precision}, "
            f"seed {cfg.seed}",
        ]
    lines += ["", "## Evaluation", ""]
    keys = list(_CARD_KEYS)
    protocol = "LEAKY (a query carries dense text of its own image)" if metrics.get("leaky") else "leak-free"
    if all(k in metrics for k in keys):
        lines += [
            "| split | images | captions | " + " | ".join(keys) + " |",
            "|" + "---|" * (len(keys) + 3),
            f"| {_split_read(metrics, dc)} | {metrics.get('images', '')} | "
            f"{metrics.get('captions', '')} | " + " | ".join(f"{metrics[k]:.1f}" for k in keys) + " |",
            "",
            f"Protocol: {protocol}; checkpoint `{record['checkpoint']}` of the run, evaluated in "
            f"`{record.get('metrics_source')}`.",
        ]
        lines += _split_warning(metrics, dc)
    else:
        lines.append(
            f"No evaluation of checkpoint `{record['checkpoint']}` with this config is recorded with the "
            f"run: `patchword eval RUN --checkpoint {record['checkpoint']}` measures it (then export again)."
        )
    lines += _published_section(imported, metrics, record, dc)
    lines += [
        "",
        _hash_line(record) + f", weights sha256 `{record[WEIGHTS_DIGEST_KEY][:16]}` (`model.safetensors`), "
        f"patchword {record['patchword_version']}.",
        "",
    ]
    return "\n".join(lines)


def _split_read(metrics: dict[str, Any], data: Any) -> str:
    """The split of the dataset the evaluation read (its recorded role through the run's data config:
    ``data.test_split=dev`` scores the dev split), not the role it was scored in."""
    return published_table.scored_split(metrics, data) or str(metrics.get("split", "test"))


def _split_warning(metrics: dict[str, Any], data: Any) -> list[str]:
    """A sentence for an evaluation of a split that is not held out: the one the checkpoint was chosen on,
    or one the model trained on."""
    use = published_table.split_use(metrics, data)
    if use == published_table.SELECTION_SPLIT:
        return [
            "",
            f"**Not a test result:** split `{_split_read(metrics, data)}` is the one training chose its "
            "checkpoint on (model selection); these figures are a validation score, not held-out test "
            "performance.",
        ]
    if use == published_table.TRAINING_SPLIT:
        return [
            "",
            f"**Not a test result:** split `{_split_read(metrics, data)}` is the one the model trained on.",
        ]
    return []


def _steps_line(record: dict[str, Any]) -> str:
    """The exported checkpoint's training step, and the run's, each labelled as what it is."""
    step, total = record.get("checkpoint_step"), record.get("run_steps")
    line = f"* checkpoint `{record['checkpoint']}`: saved at training step {'n/a' if step is None else step}"
    return line + (f" (the run trained {total} steps)" if total is not None else "")


def _hash_line(record: dict[str, Any]) -> str:
    """The hash of this directory's ``config.yaml``, and the source run's where it differs (a BERT run's
    export points its vocabulary at the copy)."""
    line = f"config hash `{record['config_hash']}` (this directory's `config.yaml`"
    source = record.get("source_config_hash")
    if source and source != record["config_hash"]:
        line += f"; the source run's, which its evaluations name: `{source}`"
    return line + ")"


_COLUMNS = ("i2t R@1", "i2t R@5", "i2t R@10", "t2i R@1", "t2i R@5", "t2i R@10", "rSum")


def _cell(value: float | None, signed: bool = False) -> str:
    """A number of the comparison table, one decimal as published; a dash where there is none."""
    return "—" if value is None else f"{value:+.1f}" if signed else f"{value:.1f}"


def _published_section(
    imported: dict[str, Any], metrics: dict[str, Any], record: dict[str, Any], data: Any = None
) -> list[str]:
    """The card's "Published vs measured here" for an imported official checkpoint: each published
    result of its method, backbone and dataset (:func:`patchword.imports.published.published_results`)
    beside the run's recorded evaluation of the exported checkpoint (``metrics``), with source, protocol
    and notes. ``data``: the run's data config (the split and data the evaluation read, for the caveats)."""
    model = published_table.imported_model(imported)
    if model is None:
        return []
    datasets = (
        " and ".join(published_table.DATASETS[d] for d in model.datasets)
        or "no dataset patchword's table knows"
    )
    lines = ["", "## Published vs measured here", ""]
    rows = model.published()
    # SCAN: the rows are those of the checkpoint's variant (t-i LSE...), which the sentence names
    backbone = f"`{model.backbone}`" + (f" (variant {model.variant})" if model.variant else "")
    if not rows:
        return lines + [
            f"patchword's table of published results has no row for the official `{model.family}` code with "
            f"backbone {backbone} on {datasets} (read from `import.json`: {model.basis})."
        ]
    lines += [
        f"The results published for the official `{model.family}` code with backbone {backbone} on "
        f"{datasets} (read from `import.json`: {model.basis}), as printed by their sources (nothing "
        "corrected; `patchword.imports.published`), beside this run's evaluation of checkpoint "
        f"`{record['checkpoint']}`. difference = measured here - published.",
        "",
    ]
    if metrics:
        lines.append(
            f"Measured here: `{record.get('metrics_source')}`, split {_split_read(metrics, data)}, "
            f"{metrics.get('images', '?')} images, "
            + ("LEAKY protocol." if metrics.get("leaky") else "leak-free protocol.")
        )
    else:
        lines.append(
            f"Not measured here yet: no evaluation of checkpoint `{record['checkpoint']}` is recorded with "
            "the run (`patchword eval RUN` measures it; then export again)."
        )
    for published in rows:
        measured = published_table.measured_metrics(metrics, published.dataset)
        compared = published_table.compare_rows(published, measured)
        title = published_table.DATASETS[published.dataset] + (
            f", {published.variant}" if published.variant else ""
        )
        lines += [
            "",
            f"**{title}**",
            "",
            "| | " + " | ".join(_COLUMNS) + " |",
            "|---" * (len(_COLUMNS) + 1) + "|",
        ]
        for row in compared:
            name = row["row"]
            if name != "published" and not measured:
                if name == "measured here":
                    lines.append("| measured here | not measured here yet |" + " |" * (len(_COLUMNS) - 1))
                continue
            values = [_cell(row[key], signed=name == "difference") for key in published_table.METRIC_KEYS]
            lines.append(f"| {name} | " + " | ".join(values) + " |")
        lines += ["", f"* source: {published.source}", f"* protocol: {published.protocol}"]
        if published.note:
            lines.append(f"* note: {published.note}")
        if measured:
            caveats = published_table.caveats(published, metrics, data, model)
            lines += [f"* caveat: {text}" for text in caveats]
    return lines
