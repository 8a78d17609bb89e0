"""Which model wrote a densify output: a fingerprint of the model's files, and the check that compares two.

Two model directories may share a name (``runs/a/llava`` and ``runs/b/llava`` both give the model id
``llava``) and even their config and every file size (two fine-tunes of one base model), so the
fingerprint reads content. Without hashing gigabytes: a file of at most :data:`WHOLE_BYTES` is hashed
whole (configs, tokenizer, processor, chat template), a larger one (the weights) by its size and
:data:`SAMPLES` blocks of :data:`SAMPLE_BYTES` spread evenly over it, its first and last bytes included
(about 1 MiB read per weights file). A fine-tune changes nearly every tensor, so sampled blocks differ;
two weights files that differ only between the sampled blocks are not told apart.

Only the top level of the directory is read, as ``from_pretrained`` reads it; hidden files and the model
card (``README*``, ``*.md``) are left out (they do not change the text). A hub id is fingerprinted by the
cached snapshot ``from_pretrained`` loaded, the same way.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from patchword.fileio import file_sha256

__all__ = [
    "SAMPLES",
    "SAMPLE_BYTES",
    "WHOLE_BYTES",
    "FIELD",
    "directory_fingerprint",
    "model_mismatch",
    "unverified",
]

#: The sidecar field that holds it.
FIELD = "model_fingerprint"
WHOLE_BYTES = 1 << 20
SAMPLES = 16
SAMPLE_BYTES = 1 << 16


def _file_digest(path: Path, size: int) -> str:
    if size <= WHOLE_BYTES:
        return file_sha256(path)
    digest = hashlib.sha256()
    with path.open("rb") as f:
        last = size - SAMPLE_BYTES
        for k in range(SAMPLES):
            f.seek(k * last // (SAMPLES - 1))
            digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()


def _counts(path: Path) -> bool:
    name = path.name
    return not name.startswith(".") and not name.upper().startswith("README") and path.suffix != ".md"


def directory_fingerprint(directory: str | os.PathLike[str]) -> str:
    """``sha256:<hex>`` over the name, size and content digest of every file the fingerprint reads (see the
    module docstring). Symbolic links (a hub snapshot's files) are followed."""
    directory = Path(directory)
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.iterdir() if p.is_file() and _counts(p)):
        size = path.stat().st_size
        digest.update(f"{path.name}\0{size}\0{_file_digest(path, size)}\n".encode())
    return f"sha256:{digest.hexdigest()}"


def model_mismatch(old: Mapping[str, object], new: Mapping[str, object]) -> str | None:
    """Why the sidecars ``old`` and ``new`` name different models, or None when they name the same one.

    Both record a fingerprint: they decide. A sidecar written before fingerprints were recorded (or by a
    caller that passed a model without one) has none: then the ``--model`` values (``model``) must be
    equal, and the model's files are taken on trust (see :func:`unverified`: the caller says so).
    """
    a, b = old.get(FIELD), new.get(FIELD)
    if a is not None and b is not None:
        if a == b:
            return None
        return (
            f"the model's files differ (--model {old.get('model')!r}, fingerprint {str(a)[:19]}..., vs "
            f"--model {new.get('model')!r}, fingerprint {str(b)[:19]}...)"
        )
    if old.get("model") != new.get("model"):
        return (
            f"--model differs ({old.get('model')!r} vs {new.get('model')!r}) and one sidecar records no "
            "model fingerprint (written by an older patchword, or a model given without one), so the --model "
            "values must be equal"
        )
    return None


def unverified(*metas: Mapping[str, object]) -> bool:
    """Whether one of these sidecars records no fingerprint (:func:`model_mismatch` compared names only)."""
    return any(meta.get(FIELD) is None for meta in metas)
