"""Which model built an index: what the manifest records, and the check that refuses another model.

Compatibility is decided by the weights and the vocabulary, hashed from what was loaded (not from file
bytes), so the same weights saved twice, or moved with their run, still match; a retrained or fine-tuned
model does not.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from patchword.errors import ConfigError, DataError
from patchword.fileio import file_sha256
from patchword.runs import LoadedRun, config_hash

__all__ = ["IndexMismatchError", "weights_sha256", "model_identity", "check_index_model"]


class IndexMismatchError(DataError):
    """The index was built by another model (different weights or tokenizer) than the one given."""


# Each model's digest with what it was computed from (see _state_key), so that reopening a searcher (every
# index update a server sees) hashes nothing: hashing copies every weight back from an accelerator.
_DIGESTS: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, str]] = weakref.WeakKeyDictionary()
_DIGESTS_LOCK = threading.Lock()


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 of a model's state dict (names, dtypes, shapes and bytes, in key order).

    Hashing the tensors rather than the checkpoint file makes the value independent of how the weights
    were saved (``best.pt`` with optimizer state, an export) and of pickling details. Computed once per
    model and state: while no tensor of the state dict is replaced, moved or written in place, the cached
    value is returned without reading (or copying back) any weight.
    """
    state = model.state_dict()
    key = _state_key(state)
    with _DIGESTS_LOCK:
        cached = _DIGESTS.get(model)
    if key is not None and cached is not None and cached[0] == key:
        return cached[1]
    digest = hashlib.sha256()
    for name, tensor in state.items():
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    if key is not None:
        with _DIGESTS_LOCK:
            _DIGESTS[model] = (key, digest.hexdigest())
    return digest.hexdigest()


def _state_key(state: dict[str, torch.Tensor]) -> tuple | None:
    """What the digest of ``state`` depends on that can be read without reading a value: each tensor's
    name, dtype, shape, device, memory and version counter (it counts in-place writes: an optimizer step,
    ``load_state_dict``; the state dict's tensors share it with the parameters). None when a tensor has no
    version counter (made under ``torch.inference_mode``): its writes cannot be seen, so it is not cached."""

    def pointer(tensor: torch.Tensor) -> int:
        try:
            return tensor.data_ptr()
        except RuntimeError:  # a tensor without storage (a subclass): its version still counts writes
            return 0

    if any(t.is_inference() for t in state.values()):
        return None
    return tuple(
        (name, t.dtype, tuple(t.shape), t.device, pointer(t), t._version) for name, t in state.items()
    )


def _file_sha256(path: Path) -> str | None:
    return file_sha256(path) if path.is_file() else None


def model_identity(run: LoadedRun) -> dict[str, Any]:
    """What an index records about its model: where it came from, what decides compatibility
    (``weights_sha256``, ``vocab_sha256``), and the shapes it produces."""
    encoder = run.model.image_encoder
    if encoder.image_size is None:
        raise ConfigError(
            "model.image_encoder",
            f"{run.run_dir}: this model reads precomputed region features, not image files; "
            "an image index needs a model with an image encoder (tiny or hf)",
        )
    size = int(encoder.image_size)
    num_patches, has_cls = encoder.num_patches, encoder.has_cls
    if num_patches is not None:
        shape = (int(num_patches) + int(has_cls), int(encoder.embed_dim))
    else:  # an encoder that does not say: ask it
        with torch.no_grad():
            probe = run.model.encode_images(torch.zeros(1, 3, size, size, device=run.device))
        shape, num_patches, has_cls = tuple(probe.shape[1:]), probe.shape[1], False
    cfg = run.config
    return {
        "run_dir": str(run.run_dir.resolve()),
        "checkpoint": str(run.checkpoint.resolve()),
        "weights_sha256": weights_sha256(run.model),
        "vocab_sha256": _file_sha256(run.run_dir / "vocab.json"),
        "config_sha256": config_hash(run.run_dir),
        "matcher": cfg.model.matcher,
        "config": asdict(cfg.model),
        "image_size": size,
        "image_tokens": int(shape[0]),
        "embed_dim": int(shape[1]),
        "num_patches": int(num_patches),
        "has_cls": bool(has_cls),
        "max_caption_len": int(cfg.data.max_caption_len),
        "max_dense_len": int(cfg.data.max_dense_len),
    }


def check_index_model(index_model: dict[str, Any], identity: dict[str, Any], index_dir: Path) -> None:
    """Raise :class:`IndexMismatchError` unless ``identity`` is the model that built the index."""
    for key, what in (("weights_sha256", "weights"), ("vocab_sha256", "vocabulary")):
        if index_model.get(key) != identity.get(key):
            raise IndexMismatchError(
                f"{index_dir} was built by another model: its {what} ({key} "
                f"{str(index_model.get(key))[:12]}, run {index_model.get('run_dir')}, checkpoint "
                f"{Path(str(index_model.get('checkpoint'))).name}) differ from those of "
                f"{identity['run_dir']} ({identity['checkpoint']}, {str(identity.get(key))[:12]}); "
                "search it with that run, or build a new index for this one (another --out)"
            )
