"""Finding Hugging Face models and tokenizers (a local directory or a hub id) and reading their
``config.json``, with errors a user can act on; which cached snapshot (commit) a hub id loads.

``transformers`` is an optional dependency (``pip install 'patchword[hf]'``), imported only when needed.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from patchword.errors import ConfigError, DataError, MissingExtraError, MissingFileError, ModelNotFoundError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = [
    "require_transformers",
    "resolve_pretrained",
    "hub_load_errors",
    "read_hf_config",
    "keyed_source_errors",
    "cached_weights",
    "check_weight_files",
    "hub_revision",
    "hub_snapshot",
    "WEIGHT_FILES",
]

#: The weights files ``from_pretrained`` looks for, in its order (a sharded checkpoint names its index).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
#: How a git-lfs pointer file starts: what a clone without ``git lfs`` leaves in place of a large file.
_LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"


def require_transformers() -> ModuleType:
    """Import and return ``transformers``, or raise an ImportError that says how to install it."""
    try:
        import transformers
    except ImportError as err:
        raise MissingExtraError(
            "the Hugging Face encoders and the BERT tokenizer need the optional dependency "
            "'transformers': pip install 'patchword[hf]'"
        ) from err
    return transformers


def _looks_like_path(name: str) -> bool:
    """Whether ``name`` can only be a filesystem path, never a hub id ("name" or "org/name")."""
    return (
        os.path.isabs(name)
        or name.startswith((".", "~"))
        or "\\" in name
        or name.endswith("/")
        or name.count("/") > 1
    )


def resolve_pretrained(
    name_or_path: str | os.PathLike[str], *, required_file: str | None = "config.json"
) -> str:
    """Check a pretrained source before handing it to ``from_pretrained``, with errors that name it.

    Args:
        name_or_path: a local directory or a hub id such as ``"bert-base-uncased"``.
        required_file: a file an existing local directory must hold (None: no check).

    Returns:
        The source as a string: an existing local directory, or a hub id.

    Raises:
        FileNotFoundError: the source is a path that does not exist, or a directory without
            ``required_file``.
        NotADirectoryError: the source is a file.
    """
    name = os.fspath(name_or_path)
    path = Path(name).expanduser()
    if path.is_dir():
        if required_file is not None and not (path / required_file).is_file():
            raise MissingFileError(
                f"local model directory '{path}' has no {required_file}; expected the output of "
                "save_pretrained() or a snapshot of a Hugging Face model repository"
            )
        return str(path)
    if path.exists():
        raise NotADirectoryError(f"'{path}' is a file; expected a model directory or a hub id")
    if _looks_like_path(name):
        raise MissingFileError(f"local model directory '{path}' does not exist")
    return name


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _offline_hint(local_files_only: bool) -> str:
    """Why nothing was downloaded, and the first thing to do about it (said before "point the config...")."""
    if _hub_offline():
        return "HF_HUB_OFFLINE is set, so nothing is downloaded: unset it, or"
    if local_files_only:
        return "downloads are off (model.hf_local_files_only=true): set model.hf_local_files_only=false, or"
    return "the hub could not be reached:"


def _cache_snapshots(name: str) -> list[Path]:
    """The snapshot folders of hub id ``name`` in the local Hugging Face cache (none: nothing of it is
    cached)."""
    try:
        from huggingface_hub import constants
    except ImportError:  # transformers without the hub library: nothing can be cached
        return []
    snapshots = Path(constants.HF_HUB_CACHE) / f"models--{name.replace('/', '--')}" / "snapshots"
    return sorted(p for p in snapshots.glob("*") if p.is_dir()) if snapshots.is_dir() else []


def hub_snapshot(hub_id: str) -> Path | None:
    """The cached snapshot folder of ``hub_id`` that ``from_pretrained`` loads (its ``main`` revision), or
    None when it cannot be found (no huggingface_hub, nothing cached)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    config = try_to_load_from_cache(hub_id, "config.json")
    return Path(config).parent if isinstance(config, str) else None


def hub_revision(source: object) -> str | None:
    """The commit of the cached snapshot a hub id ``source`` loads now (:func:`hub_snapshot`: the folder
    is named by it; ``from_pretrained(source, revision=commit)`` loads it again), or None: a local
    directory, a transformers config object, a hub id whose snapshot cannot be found."""
    if not isinstance(source, str) or Path(source).expanduser().exists():
        return None
    try:
        snapshot = hub_snapshot(source)
    except ValueError:  # not a valid repository id (huggingface_hub's HFValidationError): no hub id
        return None
    return snapshot.name if snapshot is not None else None


def cached_weights(name: str) -> bool:
    """Whether the local Hugging Face cache holds a weights file of hub id ``name`` (:data:`WEIGHT_FILES`;
    its config alone is a download cut short)."""
    return any((snapshot / file).is_file() for snapshot in _cache_snapshots(name) for file in WEIGHT_FILES)


def _weight_files(name: str) -> list[Path]:
    """The weights files (``model*.safetensors``, ``pytorch_model*.bin``: shards too) of a local directory, or
    of the cached snapshots of a hub id."""
    folders = [Path(name)] if Path(name).is_dir() else _cache_snapshots(name)
    return sorted(
        p
        for folder in folders
        for p in folder.iterdir()
        if p.suffix in (".safetensors", ".bin") and p.name.startswith(("model", "pytorch_model"))
    )


def _is_lfs_pointer(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(len(_LFS_POINTER)) == _LFS_POINTER
    except OSError:
        return False


def _load_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged model raises: torch's unpickler, safetensors' parser, a torch zip reader
    (RuntimeError), a file cut short (EOFError), transformers' refusal of a config.json or of shapes that
    disagree with the weights (ValueError, RuntimeError)."""
    errors: tuple[type[BaseException], ...] = (
        OSError,
        ValueError,
        RuntimeError,
        EOFError,
        pickle.UnpicklingError,
    )
    try:
        from safetensors import SafetensorError
    except ImportError:
        return errors
    return (*errors, SafetensorError)


def _lfs_pointers(name: str) -> list[str]:
    """The weights files of ``name`` that are git-lfs pointers (a repository cloned without git-lfs)."""
    return [p.name for p in _weight_files(name) if _is_lfs_pointer(p)]


def _where(name: str, local: bool) -> str:
    return f"the local model directory '{name}'" if local else f"'{name}' (Hugging Face cache)"


def _pointer_reason(pointers: list[str]) -> str:
    return (
        f"{', '.join(pointers)} is a git-lfs pointer, not the weights: run git lfs pull in the repository it "
        "came from (or download the weights again)"
    )


def _missing_from_cache(name: str, what: str, local_files_only: bool) -> ModelNotFoundError:
    """Hub id ``name`` has no ``what`` in the local cache: partly cached (a download cut short), or not."""
    how = _offline_hint(local_files_only)
    if _cache_snapshots(name):  # other files of it are there
        return ModelNotFoundError(
            f"'{name}' is in the local Hugging Face cache without its {what} (a download cut short?); {how} "
            "download it again, or point the config at a local copy (a directory written by save_pretrained "
            "or a hub snapshot)"
        )
    return ModelNotFoundError(
        f"'{name}' is neither a local directory nor in the local Hugging Face cache; {how} point the config "
        "at a local copy (a directory written by save_pretrained or a hub snapshot)"
    )


def check_weight_files(name: str, local_files_only: bool) -> None:
    """Without reading them: the weights of ``name`` (as :func:`resolve_pretrained` returns it) are where
    ``from_pretrained`` looks, and no git-lfs pointer stands in their place. A hub id whose weights are not
    cached passes where they may still be downloaded.

    Raises:
        ModelNotFoundError: a local directory without a weights file (:data:`WEIGHT_FILES`); a hub id cached
            without its weights while downloads are off.
        DataError: a weights file that is a git-lfs pointer.
    """
    local = Path(name).is_dir()
    pointers = _lfs_pointers(name)
    if pointers:
        raise DataError(f"could not load {_where(name, local)}: {_pointer_reason(pointers)}")
    if local and not any((Path(name) / file).is_file() for file in WEIGHT_FILES):
        raise ModelNotFoundError(
            f"local model directory '{name}' has no weights file ({WEIGHT_FILES[0]} or {WEIGHT_FILES[2]}); "
            "expected the output of save_pretrained() or a snapshot of a Hugging Face model repository"
        )
    if not local and (local_files_only or _hub_offline()) and not cached_weights(name):
        raise _missing_from_cache(name, "weights", local_files_only)


def _damage(name: str, err: BaseException, what: str, pointers: list[str]) -> str:
    """Why ``from_pretrained`` could not read the ``what`` of model ``name``: a git-lfs pointer where a
    weights file should be (``pointers``), else the reader's own first line, with the files it read."""
    reason = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
    if what != "weights":
        return f"its {what} cannot be read ({reason})"
    if pointers:
        return _pointer_reason(pointers)
    which = ", ".join(p.name for p in _weight_files(name)) or "its weights"
    return f"{which} cannot be read ({reason}): the file is damaged or incomplete; copy or download it again"


@contextlib.contextmanager
def hub_load_errors(name: str, local_files_only: bool, *, what: str = "weights") -> Iterator[None]:
    """Re-raise transformers' lookup and reading errors as one error a user can act on.

    Args:
        name: the local directory or hub id being read.
        local_files_only: downloads were off (the hint says how to allow them).
        what: what the block reads of it (``"weights"``, ``"config.json"``, ``"vocabulary (vocab.txt)"``):
            the message of a hub id whose cache holds other files of it names what is missing.

    Raises:
        ModelNotFoundError: a hub id that is not cached (or only partly), a local directory without a file
            transformers needs.
        DataError: files that are there but cannot be read: a git-lfs pointer, a damaged or truncated
            weights file, a config.json transformers refuses.
    """
    try:
        yield
    except ModelNotFoundError:
        raise
    except _load_errors() as err:
        local = Path(name).is_dir()
        pointers = _lfs_pointers(name) if what == "weights" else []
        if pointers or not isinstance(err, OSError):  # there, but not readable
            raise DataError(
                f"could not load {_where(name, local)}: {_damage(name, err, what, pointers)}"
            ) from err
        if local:  # found, but incomplete (e.g. no weights file): keep the reason
            raise ModelNotFoundError(f"could not load the local model directory '{name}': {err}") from err
        raise _missing_from_cache(name, what, local_files_only) from err


@contextlib.contextmanager
def keyed_source_errors(key: str, source: object, note: str = "") -> Iterator[None]:
    """Turn the errors of loading the pretrained model or vocabulary that config key ``key`` names
    (``model.hf_vision``, ``model.hf_text``, ``data.bert_vocab``) into one :class:`ConfigError` naming the
    key, with the message that names the path and the reason (after ``note``). A ``source`` that is no
    name (a transformers config object: an architecture, built without reading anything) passes them
    through."""
    if not isinstance(source, (str, os.PathLike)):
        yield
        return
    try:
        yield
    except ConfigError as err:
        if err.key:
            raise
        raise ConfigError(key, note + err.detail) from err
    except (ModelNotFoundError, MissingFileError, NotADirectoryError, ValueError) as err:
        # ValueError: DataError (weights that cannot be read or do not fit), a model_type of another kind
        raise ConfigError(key, note + str(err)) from err


def read_hf_config(
    name_or_path: str | os.PathLike[str], *, local_files_only: bool, reword_errors: bool = True
) -> tuple[str, PretrainedConfig]:
    """The ``config.json`` of a Hugging Face model (a local directory or a hub id; no weights are read).

    Args:
        name_or_path: a local directory or a hub id, checked by :func:`resolve_pretrained`.
        local_files_only: never download (passed to ``from_pretrained``).
        reword_errors: transformers' lookup errors as :func:`hub_load_errors` words them; False lets them
            through as transformers raised them (an ``OSError``), for a caller that words its own.

    Returns:
        ``(source, config)``: the source as ``from_pretrained`` takes it (:func:`resolve_pretrained`), and
        its transformers config (``.to_dict()``: ``{"model_type": ..., **architecture}``).

    Raises:
        MissingExtraError: transformers is not installed.
        FileNotFoundError, NotADirectoryError: as :func:`resolve_pretrained`.
        ModelNotFoundError: transformers found no config there (with ``reword_errors``; else its OSError).
        DataError: a config.json transformers refuses (with ``reword_errors``).
    """
    transformers = require_transformers()
    name = resolve_pretrained(name_or_path)
    reword = hub_load_errors(name, local_files_only, what="config.json")
    with reword if reword_errors else contextlib.nullcontext():
        config = transformers.AutoConfig.from_pretrained(name, local_files_only=local_files_only)
    return name, config
