"""Finding Hugging Face models and tokenizers (a local directory or a hub id) and reading their
``config.json``, with errors a user can act on.

``transformers`` is an optional dependency (``pip install 'patchword[hf]'``), imported only when needed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from patchword.errors import MissingExtraError, MissingFileError, ModelNotFoundError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["require_transformers", "resolve_pretrained", "hub_load_errors", "read_hf_config"]


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


@contextlib.contextmanager
def hub_load_errors(name: str, local_files_only: bool) -> Iterator[None]:
    """Re-raise transformers' lookup errors as one :class:`ModelNotFoundError` a user can act on."""
    try:
        yield
    except OSError as err:
        if Path(name).is_dir():  # found, but incomplete (e.g. no weights file): keep the reason
            raise ModelNotFoundError(f"could not load the local model directory '{name}': {err}") from err
        if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
            how = "HF_HUB_OFFLINE is set, so nothing is downloaded: unset it, or"
        elif local_files_only:
            how = (
                "downloads are off (model.hf_local_files_only=true): set model.hf_local_files_only=false, or"
            )
        else:
            how = "the hub could not be reached:"
        raise ModelNotFoundError(
            f"'{name}' is neither a local directory nor in the local Hugging Face cache; {how} point the "
            "config at a local copy (a directory written by save_pretrained or a hub snapshot)"
        ) from err


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
    """
    transformers = require_transformers()
    name = resolve_pretrained(name_or_path)
    with hub_load_errors(name, local_files_only) if reword_errors else contextlib.nullcontext():
        config = transformers.AutoConfig.from_pretrained(name, local_files_only=local_files_only)
    return name, config
