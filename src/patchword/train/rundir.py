"""A run directory on disk: its saved config, its tokenizer, its checkpoints (no model building here).

``patchword train`` writes ``config.yaml`` (the resolved :class:`RunConfig`, written once), ``vocab.json``
(word tokenizers), ``best.pt`` / ``last.pt``, ``export/`` and the metrics files; everything that reads a run
back goes through these functions (:func:`patchword.runs.load_run` builds the model on top of them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from patchword.config import load_config
from patchword.data.config import DataConfig
from patchword.errors import MissingFileError
from patchword.train.config import RunConfig

__all__ = [
    "CONFIG_FILE",
    "VOCAB_FILE",
    "BACKBONES_FILE",
    "save_backbones",
    "build_run_model",
    "read_run_config",
    "config_hash",
    "load_run_tokenizer",
    "resolve_checkpoint",
    "METRICS_FILE",
    "drop_metrics_after",
]

CONFIG_FILE = "config.yaml"
VOCAB_FILE = "vocab.json"
METRICS_FILE = "metrics.jsonl"


def read_run_config(run_dir: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """The run's saved config, with dotted ``overrides`` applied in memory (the file is never changed)."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    if not run_dir.is_dir():
        raise MissingFileError(f"run directory {run_dir} does not exist")
    if not path.is_file():
        raise MissingFileError(f"{run_dir} is not a run directory: it has no {CONFIG_FILE}")
    return load_config(RunConfig, path, list(overrides))


def config_hash(run_dir: str | Path) -> str:
    """sha256 of the run's ``config.yaml`` bytes (first 16 hex digits): which settings produced a result."""
    return hashlib.sha256((Path(run_dir) / CONFIG_FILE).read_bytes()).hexdigest()[:16]


def load_run_tokenizer(run_dir: str | Path, data: DataConfig):
    """The tokenizer the run trained with: its saved ``vocab.json`` (word), or the BERT vocabulary."""
    from patchword.data.tokenizers import WordVocab

    vocab = Path(run_dir) / VOCAB_FILE
    if data.tokenizer == "word":
        if not vocab.is_file():
            raise MissingFileError(f"{vocab} is missing: a run with data.tokenizer=word saves its vocabulary")
        return WordVocab.load(vocab)
    from patchword.data.tokenizers import BertCaptionTokenizer

    return BertCaptionTokenizer.from_pretrained(data.bert_vocab)


def resolve_checkpoint(run_dir: str | Path, checkpoint: str | Path | None = None) -> Path:
    """``run_dir/best.pt`` (default) or the named file; a missing file is an error naming what exists."""
    run_dir = Path(run_dir)
    path = Path(checkpoint) if checkpoint is not None else run_dir / "best.pt"
    if not path.is_absolute() and not path.is_file() and (run_dir / path).is_file():
        path = run_dir / path
    if not path.is_file():
        found = sorted(p.name for p in run_dir.glob("*.pt"))
        hint = f" (it has {', '.join(found)}: pass --checkpoint)" if found else " (it has no checkpoint)"
        raise MissingFileError(f"checkpoint {path} does not exist in {run_dir}{hint}")
    return path


BACKBONES_FILE = "backbones.json"


def save_backbones(model, run_dir: Path) -> None:
    """Record the run's Hugging Face backbone architectures (nothing for tiny / region encoders)."""
    from patchword.fileio import atomic_write_text

    architectures = model.backbone_architectures()
    if architectures:
        atomic_write_text(Path(run_dir) / BACKBONES_FILE, json.dumps(architectures, indent=2))


def build_run_model(run_dir: str | Path, cfg: RunConfig, vocab_size: int | None, vocab_words=None):
    """The model of a saved run, ready for its checkpoint: built from the run's own files only.

    Every weight comes from the checkpoint, so nothing the config pointed at to *initialise* the model is
    needed any more: not the pretrained tiny encoders (``model.tiny_pretrained``), not the Hugging Face
    weights (rebuilt from ``backbones.json``, randomly initialised), not ``train.init_from``.
    """
    from patchword.model import build_model, started_pretrained

    path = Path(run_dir) / BACKBONES_FILE
    random_init = json.loads(path.read_text()) if path.is_file() else None
    model_cfg = dataclasses.replace(cfg.model, tiny_pretrained="")
    model = build_model(model_cfg, vocab_size=vocab_size, vocab_words=vocab_words, random_init=random_init)
    # The encoders that started from pretrained weights train at the backbone learning rate: the same
    # optimiser parameter groups as the run's checkpoint, although their weights now come from it.
    model.image_encoder.pretrained, model.text_encoder.pretrained = started_pretrained(cfg.model)
    return model


def drop_metrics_after(run_dir: str | Path, step: int) -> int:
    """Keep the records of ``metrics.jsonl`` up to ``step`` (the checkpoint a resume starts from), dropping
    those of the steps the resume will redo and a last line cut short by a kill; returns how many were
    dropped."""
    from patchword.fileio import keep_jsonl_records

    return keep_jsonl_records(Path(run_dir) / METRICS_FILE, lambda record: int(record["step"]) <= step)
