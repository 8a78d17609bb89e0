"""Reading a run directory back: config, tokenizer, checkpoint, model (``patchword eval``, index building,
search, serving, plots and benchmarks all load runs through :func:`load_run`).

A run directory written by ``patchword train`` holds ``config.yaml`` (the resolved :class:`RunConfig`,
written once), ``vocab.json`` (word tokenizers), ``backbones.json`` (Hugging Face architectures),
``best.pt`` / ``last.pt``, ``metrics.jsonl``, ``summary.json`` and ``export/``. Which of its weights files
is loaded (:func:`resolve_checkpoint`) lives in :mod:`patchword.runs.weights`, re-exported here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from patchword.checkpoint import load_fitting_weights, load_weights
from patchword.config import apply_overrides, config_from_mapping
from patchword.data.config import DataConfig
from patchword.data.prepare import reads_dense_text
from patchword.device import checked_device
from patchword.errors import ConfigError, DataError, MissingFileError
from patchword.model import RetrievalModel, build_model, check_option_overrides, started_pretrained
from patchword.precision import weight_dtype
from patchword.readers import read_json, read_json_lines, read_yaml_mapping
from patchword.runs.config import RunConfig
from patchword.runs.files import (
    BACKBONES_FILE,
    BERT_VOCAB_DIR,
    BERT_VOCAB_FILE,
    CONFIG_FILE,
    EXPORT_DIR,
    RESUMES_FILE,
    RUN_FILES,
    VOCAB_FILE,
    WEIGHTS_FILE,
)
from patchword.runs.origins import pin_hub_revisions
from patchword.runs.weights import (
    WEIGHTS_DIGEST_KEY,
    check_backbone_overrides,
    check_export_weights,
    resolve_checkpoint,
)

__all__ = [
    "LoadedRun",
    "RUN_FILES",
    "WEIGHTS_DIGEST_KEY",
    "load_run",
    "read_run_config",
    "resume_overrides",
    "last_session_config",
    "read_run_mapping",
    "check_export_weights",
    "config_kind",
    "refuse_run_output",
    "load_run_tokenizer",
    "config_hash",
    "resolve_checkpoint",
    "build_run_model",
    "check_backbone_overrides",
    "save_backbones",
]


#: What a loaded model scoring with image-tied dense text warns, called without it (:class:`_DenseTextCheck`)
WITHOUT_DENSE_TEXT = (
    "this model was evaluated with one dense caption per image and is called without dense text: its "
    "scores differ from its evaluation's; pass each image's dense caption (dense_ids / dense_lens), or load "
    "it with load_run(..., overrides=['data.dense=false']) to score without them"
)

#: What each kind of run is called, and the command that writes it (:func:`config_kind`).
_KINDS = {"retrieval": "a retrieval run (patchword train)", "hashing": "a hashing run (patchword hash train)"}


def config_kind(data: dict) -> str | None:
    """Which kind of run a ``config.yaml`` mapping belongs to, by its shape: ``"hashing"`` (a
    ``HashRunConfig``: ``data.format``, ``model.bits``), ``"retrieval"`` (a :class:`RunConfig`:
    ``data.dataset``, ``model.matcher``), None when it says neither (a hand-written partial file)."""
    sections = {
        name: data.get(name) if isinstance(data.get(name), dict) else {} for name in ("data", "model")
    }
    hashing = "format" in sections["data"] or "bits" in sections["model"]
    retrieval = "dataset" in sections["data"] or "matcher" in sections["model"]
    return "hashing" if hashing and not retrieval else "retrieval" if retrieval and not hashing else None


def read_run_mapping(run_dir: str | Path, kind: str = "retrieval") -> dict:
    """The mapping of ``run_dir``'s ``config.yaml``, refused (one line naming it) when it is empty or
    the config of another ``kind`` of run (a hashing run handed to ``patchword eval``: its keys were each
    reported as an unknown config key).

    Raises:
        MissingFileError: no such run directory (or a file), or it has no config.yaml.
        DataError: the file is not a YAML mapping, is empty, or belongs to another kind of run.
    """
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    if run_dir.is_file():
        raise MissingFileError(f"{run_dir} is a file: give the run directory ({run_dir.parent})")
    if not run_dir.is_dir():
        raise MissingFileError(f"run directory {run_dir} does not exist")
    if not path.is_file():
        raise MissingFileError(f"{run_dir} is not a run directory: it has no {CONFIG_FILE}")
    data = read_yaml_mapping(path, "run config")
    if not data:  # the defaults of every key would build a model the checkpoint does not fit
        raise DataError(f"{path}: not a run config: the file is empty (the run's settings are lost)")
    found = config_kind(data)
    if found is not None and found != kind:
        raise DataError(f"{run_dir} is {_KINDS[found]}, not {_KINDS[kind]}")
    return data


def read_run_config(run_dir: str | Path, overrides: Sequence[str] | None = ()) -> RunConfig:
    """The run's saved config, with dotted ``overrides`` applied in memory (the file is never changed).

    Raises:
        MissingFileError, DataError: as :func:`read_run_mapping` (no run, an empty config.yaml, a hashing
            run's).
        ConfigError: an unknown key or a wrong value, in the file or the overrides; an override of a
            matcher option the run does not read, or of token geometry
            (:func:`~patchword.model.check_option_overrides`).
    """
    data = read_run_mapping(run_dir)  # read once: checked here, then built
    config = config_from_mapping(RunConfig, data, Path(run_dir) / CONFIG_FILE)
    config = apply_overrides(config, list(overrides or ()))
    check_option_overrides(config.model, overrides or ())
    return config


def resume_overrides(run_dir: str | Path) -> list[list[str]]:
    """The overrides of each ``--resume`` of ``run_dir`` in order (``resumes.jsonl``); each resume applies its
    own to ``config.yaml`` (``resume_run``), so the last give the config the run ended with.

    Raises:
        DataError: a damaged log, or a resume whose ``overrides`` is not a list of strings (naming it).
    """
    path = Path(run_dir) / RESUMES_FILE
    sessions = []
    for i, resume in enumerate(read_json_lines(path, "resume log"), start=1):
        overrides = resume.get("overrides", [])
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise DataError(f"{path}: resume {i}: 'overrides' is not a list of key=value strings")
        sessions.append(overrides)
    return sessions


def last_session_config(run_dir: str | Path) -> RunConfig:
    """The config the run's last session ran with: ``config.yaml`` with the overrides of its last
    ``--resume`` (each resume applies its own to ``config.yaml``: ``resume_run``).

    Raises:
        MissingFileError, DataError: as :func:`read_run_config` and :func:`resume_overrides`; an override of
            the last resume that does not apply is a DataError naming ``resumes.jsonl``.
        ConfigError: an unknown key or a wrong value in ``config.yaml``.
    """
    sessions = resume_overrides(run_dir)
    config = read_run_config(run_dir)
    try:
        return apply_overrides(config, sessions[-1] if sessions else [])
    except ConfigError as err:
        path = Path(run_dir) / RESUMES_FILE
        raise DataError(f"{path}: its last resume's overrides do not apply ({err})") from None


def refuse_run_output(
    out: str | Path,
    run_dirs: Sequence[str | Path] = (),
    reads: Sequence[str | Path] = (),
    *,
    names: frozenset[str] = RUN_FILES,
    flag: str = "--out",
) -> None:
    """Before any work: the file a command writes is neither one it reads (``reads``: the checkpoint it
    evaluates...) nor one of the files of a run it reads (``names``, any ``*.pt`` and anything in
    ``export/`` of each of ``run_dirs``), nor a record of any other run or model folder (:func:`_recorded_by`:
    ``OTHER_RUN/summary.json``, ``OTHER_RUN/eval_test.json``): ``--force`` overwrites a file the command
    wrote before, never a run's checkpoint or config. A new name in a run directory read is allowed
    (``eval_dev.json``). Raises ConfigError naming ``flag``."""
    target = Path(out).resolve()
    for path in reads:
        if Path(path).resolve() == target:
            raise ConfigError(flag, f"{out} is {path}, which this command reads: choose another file")
    for run_dir in run_dirs:
        run = Path(run_dir).resolve()
        own = target.parent == run and (target.name in names or target.suffix == ".pt")
        if own or target.parent == run / EXPORT_DIR:
            raise ConfigError(
                flag, f"{out} is one of the files of run {run_dir} ({target.name}): choose another file"
            )
    if (recorded := _recorded_by(target, {Path(run_dir).resolve() for run_dir in run_dirs})) is not None:
        raise ConfigError(flag, f"{out} is one of the files of {recorded}: choose another file")


def _recorded_by(target: Path, evaluated: set[Path]) -> str | None:
    """The run, export or encoders folder (``config.yaml`` or ``model.safetensors`` in it) of which resolved
    ``target`` is a record (a run file, an export's card or ``config.json``, a checkpoint, anything in its
    ``export/`` or ``bert_vocab/``, an ``eval_*.json`` of a run not ``evaluated``), described; None for any
    other file."""
    folder, names = target.parent, RUN_FILES | {"README.md", "config.json"}
    if (folder.parent / CONFIG_FILE).is_file() and folder.name in (EXPORT_DIR, BERT_VOCAB_DIR):
        return f"run {folder.parent}"
    if folder not in evaluated and target.name.startswith("eval_") and target.suffix == ".json":
        names = names | {target.name}  # the report reads it as that run's evaluation
    if not (target.name in names or target.suffix in (".pt", ".safetensors")):
        return None
    if (folder / WEIGHTS_FILE).is_file():  # an export, training's export/, pretrained encoders
        return f"model directory {folder}"
    return f"run {folder}" if (folder / CONFIG_FILE).is_file() else None


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

    # The BERT vocabulary a run carries: bert_vocab/ (a trained run, whose data.bert_vocab says where it came
    # from; an export), or what data.bert_vocab names relative to the run (an import); else that source.
    carried = Path(run_dir) / BERT_VOCAB_DIR
    if (carried / "vocab.txt").is_file():
        return BertCaptionTokenizer.from_pretrained(carried)
    source = data.bert_vocab_source()
    own = Path(run_dir) / source
    if Path(source) in (Path(BERT_VOCAB_DIR), Path(BERT_VOCAB_FILE)):  # its own: there only, not a cwd file
        wanted = own / "vocab.txt" if Path(source) == Path(BERT_VOCAB_DIR) else own
        if not wanted.is_file():
            raise MissingFileError(
                f"{wanted.absolute()} is missing: the model directory {run_dir} carries its BERT "
                f"vocabulary there (data.bert_vocab: {source}); copy the whole directory"
            )
    return BertCaptionTokenizer.from_pretrained(str(own) if own.exists() else source)


def save_backbones(model, run_dir: Path) -> None:
    """Record the run's Hugging Face backbone architectures (nothing for tiny / region encoders) when it
    starts. A backbone loaded from a hub id also records the commit of the cached snapshot its id names
    (``_commit_hash``: transformers' own key for it, which rebuilding the architecture ignores): which
    revision the run started from, for its card and for anyone training it again, once the id's ``main``
    has moved on (:func:`~patchword.runs.origins.pin_hub_revisions`, as an import records it). Nothing reads
    the hub id again (:func:`build_run_model`, :func:`load_run_tokenizer`)."""
    from patchword.fileio import atomic_write_text

    encoders = {"vision": model.image_encoder, "text": model.text_encoder}
    architectures = model.backbone_architectures()
    # the ids refs/main names now, moments after the model loaded them (one built from an architecture: none)
    loaded = [role for role in architectures if getattr(encoders[role], "pretrained", False)]
    architectures = pin_hub_revisions(architectures, loaded)
    if architectures:
        atomic_write_text(Path(run_dir) / BACKBONES_FILE, json.dumps(architectures, indent=2))


def build_run_model(run_dir: str | Path, cfg: RunConfig, vocab_size: int | None, vocab_words=None):
    """The model of a saved run, ready for its checkpoint: built from the run's own files only.

    Every weight comes from the checkpoint, so nothing the config pointed at to *initialise* the model is
    needed any more: not the pretrained tiny encoders (``model.tiny_pretrained``), not the Hugging Face
    weights (rebuilt from ``backbones.json``, randomly initialised), not ``train.init_from``.
    """
    path = Path(run_dir) / BACKBONES_FILE
    random_init = read_json(path, path.name, default={})
    model_cfg = dataclasses.replace(cfg.model, tiny_pretrained="")
    # saved: token geometry an older run's model.options holds is accepted where it agrees with the encoders
    model = build_model(
        model_cfg, vocab_size, vocab_words, random_init=random_init, saved=Path(run_dir) / CONFIG_FILE
    )
    # The encoders that started from pretrained weights train at the backbone learning rate: the same
    # optimiser parameter groups as the run's checkpoint, although their weights now come from it.
    model.image_encoder.pretrained, model.text_encoder.pretrained = started_pretrained(cfg.model)
    return model


@dataclass
class LoadedRun:
    """A run directory loaded for inference.

    Attributes:
        run_dir: the directory.
        config: its resolved :class:`RunConfig` (plus any in-memory overrides).
        model: the :class:`RetrievalModel` with the checkpoint's weights, in eval mode, on ``device``.
        tokenizer: the run's text tokenizer.
        checkpoint: the weights file that was loaded.
        device: where the model lives.
    """

    run_dir: Path
    config: RunConfig
    model: RetrievalModel
    tokenizer: object
    checkpoint: Path
    device: torch.device

    @property
    def image_size(self) -> int:
        """Square input side of the image encoder in pixels."""
        size = self.model.image_encoder.image_size
        if size is None:
            raise ValueError(f"{self.run_dir}: the image encoder does not take images (region features?)")
        return int(size)

    def image_transform(self):
        """PIL image -> (3, H, W) float32 tensor, preprocessed as the image encoder expects."""
        from patchword.data.transforms import test_transform

        enc = self.model.image_encoder
        return test_transform(self.image_size, enc.image_mean, enc.image_std)

    def preprocess_images(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """PIL images -> (B, 3, H, W) float32 on the CPU (8-bit RGB first: :func:`~patchword.data.images.
        rgb_image`, which reads 16-bit greyscale by its high byte where ``convert("RGB")`` clips it)."""
        from patchword.data.images import rgb_image

        transform = self.image_transform()
        return torch.stack([transform(rgb_image(image)) for image in images])

    def tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Captions -> ((B, L) ids, (B,) lens), truncated to ``data.max_caption_len`` as in training.
        One str is a TypeError (the tokenizer's: ``list`` would make it a caption per character)."""
        texts = texts if isinstance(texts, str) else list(texts)
        return self.tokenizer.batch_encode(texts, max_len=self.config.data.max_caption_len)


def load_run(
    run_dir: str | Path,
    checkpoint: str | Path | None = None,
    *,
    device: str | torch.device = "cpu",
    overrides: Sequence[str] = (),
    config: RunConfig | None = None,
) -> LoadedRun:
    """Load ``run_dir`` (config, tokenizer, weights) for inference.

    Args:
        run_dir: a directory written by ``patchword train`` (or the demo).
        checkpoint: a file inside ``run_dir`` (``best.pt``, ``last.pt``) or a path; default ``best.pt``.
        device: where to put the model: ``auto`` (:func:`patchword.device.resolve_device`) or a torch
            device (:func:`patchword.device.checked_device`).
        overrides: dotted config overrides applied in memory (e.g. ``eval.max_memory_mb=4096``).
        config: the run's config with ``overrides`` applied (:func:`read_run_config`), when the caller has
            read it already; None reads it here.

    Raises:
        MissingFileError: no such run directory, no config.yaml, no vocabulary or no checkpoint.
        DataError: an empty config.yaml or a hashing run's; an exported ``model.safetensors`` whose sha256
            is not the one its export recorded.
        ConfigError: an override the run cannot apply (:func:`check_backbone_overrides`,
            :func:`~patchword.model.check_option_overrides`); a ``device`` this machine lacks.
    """
    # before anything is read or built, as create_model checks it
    device = checked_device(device)
    run_dir = Path(run_dir)
    cfg = config if config is not None else read_run_config(run_dir, overrides)  # options checked there
    check_backbone_overrides(run_dir, overrides)
    if config is not None:  # a caller's config: the build checks neither other sections nor geometry
        check_option_overrides(cfg.model, overrides)
    path = resolve_checkpoint(run_dir, checkpoint)
    check_export_weights(run_dir, path)
    tokenizer = load_run_tokenizer(run_dir, cfg.data)
    from patchword.data.tokenizers import WordVocab

    words = list(tokenizer.idx2word) if isinstance(tokenizer, WordVocab) else None
    model = build_run_model(run_dir, cfg, len(words) if words else None, words)
    model.to(weight_dtype(cfg.precision))  # before loading: an fp64 run's weights stay fp64
    # shapes or names differ: the overrides changed the architecture
    builds = "this config builds" + (f" (overrides: {' '.join(overrides)})" if overrides else "")
    load_fitting_weights(model, load_weights(path), path, "model", builds)
    if reads_dense_text(cfg.data, model.matcher.consumes_dense) and model.matcher.dense_pairing == "image":
        check = _DenseTextCheck()
        check.handle = model.register_forward_pre_hook(check, with_kwargs=True)
    model.to(device).eval()
    return LoadedRun(run_dir, cfg, model, tokenizer, path, device)


class _DenseTextCheck:
    """Forward pre-hook of a loaded model whose run scores with image-tied dense text (caption-tied: no query
    has it): the first call without ``dense_ids`` warns, then the hook goes (``handle``). On the model, not
    the matcher, whose forward library code calls without dense text on purpose; a class: it pickles."""

    def __call__(self, model: RetrievalModel, args: tuple, kwargs: dict) -> None:
        if kwargs.get("dense_ids", args[3] if len(args) > 3 else None) is None:
            warnings.warn(WITHOUT_DENSE_TEXT, UserWarning, stacklevel=2)
            self.handle.remove()
