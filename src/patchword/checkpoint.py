"""Checkpoints: atomic saving and safe loading, RNG state capture, the weights-only export, warm starts."""

from __future__ import annotations

import contextlib
import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save

from patchword.fileio import atomic_write, atomic_write_bytes, atomic_write_text
from patchword.readers import read_checkpoint, read_safetensors
from patchword.version import __version__

_logger = logging.getLogger(__name__)

__all__ = [
    "atomic_save",
    "load_checkpoint",
    "rng_state",
    "set_rng_state",
    "export_weights",
    "seed_everything",
    "seeded_generators",
    "load_weights",
    "warm_start",
]


def atomic_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` through a temporary file and ``os.replace``."""
    atomic_write(path, lambda fh: torch.save(obj, fh))


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a training checkpoint written by :func:`atomic_save` (plain containers only).

    Raises:
        MissingFileError: no such file.
        DataError: anything that is not a patchword checkpoint (empty, text, truncated, another kind of
            ``torch.save`` file); one line naming the file (:func:`patchword.readers.read_checkpoint`).
    """
    return read_checkpoint(path, map_location, what="patchword checkpoint", require=("model",))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    # The legacy global numpy generator is what user code and older libraries draw from.
    np.random.seed(seed)  # noqa: NPY002
    torch.manual_seed(seed)


@contextlib.contextmanager
def seeded_generators(seed: int, device: torch.device | str | None = None) -> Iterator[None]:
    """The process's global Python, numpy and torch generators seeded with ``seed`` for the block
    (:func:`seed_everything`), and back in the caller's states after it, whatever the block seeded or drew:
    a library function must not change process-wide settings, and a caller's ``seed; call; draw`` must
    draw what ``seed; draw`` does. Inside the block the generators are those of :func:`seed_everything`
    (a seeded run's results do not change).

    torch's CPU generator always; the CUDA generators of every device (``torch.manual_seed`` seeds them
    all) when CUDA is initialised already or ``device`` is a CUDA device (reading a CUDA generator's state
    initialises CUDA: a run on the CPU does not).
    """
    python, legacy_numpy = random.getstate(), np.random.get_state()  # noqa: NPY002
    device = torch.device(device) if device is not None else None
    cuda = torch.cuda.is_available() and (
        torch.cuda.is_initialized() or (device is not None and device.type == "cuda")
    )
    try:
        with torch.random.fork_rng(
            devices=range(torch.cuda.device_count()) if cuda else [], device_type="cuda"
        ):
            seed_everything(seed)
            yield
    finally:
        random.setstate(python)
        np.random.set_state(legacy_numpy)  # noqa: NPY002


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and CUDA) generator states, in types ``weights_only`` loading accepts."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()  # noqa: NPY002
    state = {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))  # noqa: NPY002
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def export_weights(
    model: torch.nn.Module, config: dict[str, Any], directory: str | Path, **extra: Any
) -> None:
    """Write ``model.safetensors`` + ``config.json`` (the resolved run config and library version)."""
    directory = Path(directory)
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_write_bytes(directory / "model.safetensors", save(tensors))
    meta = {"patchword_version": __version__, "config": config, **extra}
    atomic_write_text(directory / "config.json", json.dumps(meta, indent=2))


def weights_file(path: str | Path) -> Path:
    """The file :func:`load_weights` reads at ``path``: ``path`` itself, or for a directory (an export
    directory, or a run directory holding one) its ``model.safetensors``, else its export's
    (``runs.files.WEIGHTS_FILE`` / ``EXPORT_DIR``, spelled here because this module sits below
    ``patchword.runs``); the first of those two when neither exists."""
    path = Path(path)
    if not path.is_dir():
        return path
    candidates = [path / "model.safetensors", path / "export" / "model.safetensors"]
    return next((c for c in candidates if c.is_file()), candidates[0])


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Model weights from a training checkpoint (``best.pt`` / ``last.pt``), an export directory or a
    ``model.safetensors`` file (:func:`weights_file`)."""
    path = weights_file(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no weights at {path} (expected best.pt, last.pt, an export dir or .safetensors)"
        )
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    return load_checkpoint(path)["model"]


def load_fitting_weights(
    model: torch.nn.Module, weights: dict[str, Any], path: Any, key: str, builds: str
) -> None:
    """``model.load_state_dict(weights)``; weights that do not fit (other shapes or names) are a
    :class:`~patchword.errors.ConfigError` naming ``key`` and the first mismatch: "the weights in PATH do not
    fit the model ``builds``: ..." (``builds``: what made the model, e.g. "this config builds")."""
    from patchword.errors import ConfigError

    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        detail = str(err).split("\n\t", 2)
        raise ConfigError(
            key, f"the weights in {path} do not fit the model {builds}: {_few_keys(' '.join(detail[1:2]))}"
        ) from None


def _few_keys(detail: str, shown: int = 3) -> str:
    """torch's "Missing key(s) in state_dict: "a", "b", ..." with its list cut to the first ``shown`` names
    and the count (a checkpoint of another model lists hundreds: one line must stay readable)."""
    head, sep, listing = detail.partition(" in state_dict: ")
    names = listing.strip().removesuffix(".").split(", ")
    if not sep or len(names) <= shown:
        return detail
    return f"{head} in state_dict: {', '.join(names[:shown])} and {len(names) - shown} more."


def warm_start(model: torch.nn.Module, path: str | Path) -> dict[str, list[str]]:
    """Copy every weight of ``path`` whose name and shape match ``model``; the rest keep their init.

    Meant for starting a fine-grained model from a globally trained one (same encoders, a new matcher
    head). Returns ``{"loaded", "skipped", "missing"}`` key lists (skipped: in the file, absent or
    differently shaped in the model; missing: in the model, not in the file) and logs their counts.

    Raises:
        ValueError: when nothing matches (almost certainly the wrong file).
    """
    source = load_weights(path)
    target = model.state_dict()
    loaded = [k for k, v in source.items() if k in target and target[k].shape == v.shape]
    skipped = sorted(set(source) - set(loaded))
    missing = sorted(set(target) - set(loaded))
    if not loaded:
        raise ValueError(f"warm start from {path}: no weight name and shape matches the model")
    model.load_state_dict({k: source[k] for k in loaded}, strict=False)
    _logger.info(
        "warm start from %s: %d tensors loaded, %d skipped (not in the model or other shape), "
        "%d keep their initialisation",
        path,
        len(loaded),
        len(skipped),
        len(missing),
    )
    return {"loaded": sorted(loaded), "skipped": skipped, "missing": missing}
