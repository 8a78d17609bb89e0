"""Which weights file a run directory loads (:func:`resolve_checkpoint`: ``best.pt``, an export's
``model.safetensors``, or the file ``--checkpoint`` names), whether an exported model's weights are still
those its export wrote (:func:`check_export_weights`), and the overrides its recorded backbones and
vocabulary make void (:func:`check_backbone_overrides`). :mod:`patchword.runs.load` re-exports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from patchword.errors import ConfigError, DataError
from patchword.readers import read_json, require_file
from patchword.runs.files import BACKBONES_FILE, BERT_VOCAB_DIR, BEST_CHECKPOINT, METRICS_JSON, WEIGHTS_FILE

__all__ = ["WEIGHTS_DIGEST_KEY", "check_backbone_overrides", "check_export_weights", "resolve_checkpoint"]

#: The key of an exported model directory's ``metrics.json`` that records the sha256 of its
#: ``model.safetensors`` (``patchword export``): safetensors keeps no checksum, so flipped bytes inside a
#: tensor would load as other weights without an error.
WEIGHTS_DIGEST_KEY = "weights_sha256"


def check_export_weights(run_dir: Path, path: Path) -> None:
    """``path``, the weights of the exported model directory ``run_dir``, is still what the export wrote
    (its recorded sha256); an export that recorded none (written before the digest was) is taken as it is.

    Raises:
        DataError: the digests differ, naming the file; the recorded digest is not a string, naming the
            export record.
    """
    from patchword.fileio import file_sha256

    if path.resolve() != (run_dir / WEIGHTS_FILE).resolve():
        return
    record = read_json(run_dir / METRICS_JSON, f"export record ({METRICS_JSON})", default={})
    recorded = record.get(WEIGHTS_DIGEST_KEY)
    if recorded is not None and not isinstance(recorded, str):  # not the weights' fault
        raise DataError(f"{run_dir / METRICS_JSON}: {WEIGHTS_DIGEST_KEY} is {recorded!r}, not a string")
    if recorded and file_sha256(path) != recorded:
        raise DataError(
            f"{path}: not the weights the export wrote: its sha256 differs from the {WEIGHTS_DIGEST_KEY} "
            f"in {run_dir / METRICS_JSON} (the file is damaged: copy or export it again)"
        )


def resolve_checkpoint(run_dir: str | Path, checkpoint: str | Path | None = None) -> Path:
    """``run_dir/best.pt`` (default; ``model.safetensors`` in an exported model directory) or the named
    file; a missing file is an error naming what exists, a directory in its place one saying so.

    A relative name is the run's own entry when the run has one (``--checkpoint last.pt`` is
    ``run_dir/last.pt`` even where the working directory holds a ``last.pt`` of another run; so is a
    directory such as ``--checkpoint export``, refused as one), else a path from the working directory
    (``--checkpoint ../other/best.pt``).

    Raises:
        MissingFileError: ``"checkpoint PATH is a directory, not a file..."`` or ``"... does not exist..."``.
    """
    run_dir = Path(run_dir)
    default = run_dir / BEST_CHECKPOINT
    # an export has no best.pt: its weights file is the default, even when something broke it (a directory
    # in its place is named as such, not reported as a missing best.pt)
    if (
        checkpoint is None
        and not default.exists()
        and ((run_dir / WEIGHTS_FILE).exists() or _is_export(run_dir))
    ):
        default = run_dir / WEIGHTS_FILE
    path = Path(checkpoint) if checkpoint is not None else default
    if checkpoint is not None and not path.is_absolute() and (run_dir / path).exists():
        path = run_dir / path
    hint = None
    # what the run has, where the user may have mistyped or named a directory (--checkpoint export)
    if not path.is_file() and (checkpoint is not None or not path.is_dir()):
        found = sorted(p.name for p in [*run_dir.glob("*.pt"), run_dir / WEIGHTS_FILE] if p.is_file())
        hint = (
            f"{run_dir} has {', '.join(found)} (pass checkpoint= / --checkpoint)"
            if found
            else f"{run_dir} has no checkpoint"
        )
    require_file(path, "checkpoint", hint=hint)
    return path


def _is_export(run_dir: Path) -> bool:
    """Whether ``run_dir`` is an exported model directory (its export record names the weights' sha256):
    one whose weights file is gone misses that file, not a best.pt it never had."""
    try:
        return WEIGHTS_DIGEST_KEY in read_json(run_dir / METRICS_JSON, METRICS_JSON, default={})
    except DataError:  # a damaged record says nothing here; loading it later says what is wrong
        return False


#: The override keys that name a Hugging Face backbone, with the role ``backbones.json`` records it under.
_BACKBONE_KEYS = {"model.hf_vision": ("vision", "image"), "model.hf_text": ("text", "text")}


def check_backbone_overrides(run_dir: str | Path, overrides: Sequence[str]) -> None:
    """An override of ``data.bert_vocab`` where the run carries its vocabulary (``bert_vocab/``) is refused
    (its tokenizer reads that copy), and one of ``model.hf_vision`` / ``model.hf_text`` where the run's
    ``backbones.json`` records that backbone: :func:`build_run_model` rebuilds it from the recorded
    architecture and the checkpoint gives every weight, so the override would be ignored. Where the file
    records none (a tiny or region encoder; a run written before the file was), the override is applied as
    before: the backbone is built from it, then the checkpoint's weights are loaded into it.

    Raises:
        ConfigError: naming the key.
        DataError: a damaged ``backbones.json`` (read only when such an override is given).
    """
    keys = [item.split("=", 1)[0].strip() for item in overrides if "=" in item]
    if "data.bert_vocab" in keys and (Path(run_dir) / BERT_VOCAB_DIR / "vocab.txt").is_file():
        raise ConfigError(
            "data.bert_vocab",
            f"the run carries its vocabulary ({Path(run_dir) / BERT_VOCAB_DIR}), which its tokenizer reads: "
            "the override would be ignored; drop it",
        )
    keys = [key for key in keys if key in _BACKBONE_KEYS]
    if not keys:
        return
    path = Path(run_dir) / BACKBONES_FILE
    recorded = read_json(path, path.name, default={})
    for key in keys:
        role, what = _BACKBONE_KEYS[key]
        if role in recorded:
            raise ConfigError(
                key,
                f"the run's {BACKBONES_FILE} decides its {what} backbone ({path} records the architecture, "
                "the checkpoint holds the weights): the override would be ignored; drop it",
            )
