"""Where the weights of a run's encoders came from, in words, for its model card (:mod:`patchword.runs.card`).

Each encoder starts somewhere before the run trains it:

* an imported official checkpoint (``import.json``): every tensor from that checkpoint (its family and
  sha256), on an architecture recorded in ``backbones.json``; the ``--hf-vision`` / ``--hf-text`` directory
  given to the import supplied that architecture only, never weights;
* pretrained tiny encoders (``model.tiny_pretrained``): both tiny encoders, from one directory or
  shipped name;
* a Hugging Face backbone (``model.hf_vision`` / ``model.hf_text``): architecture and initial weights (of a
  hub id: the snapshot commit ``backbones.json`` records, ``_commit_hash``);
* GloVe vectors (``model.gru.glove_path``): the word embeddings of a GRU text encoder;
* otherwise random initialisation (from scratch); region features (``precomp``) are the data's, the encoder
  over them starts from scratch.

A warm start (``train.init_from``) then overwrites every tensor whose name and shape match, after all of
the above (``patchword.checkpoint.warm_start``). Training records what it loaded when it starts: the first
record of the run's ``metrics.jsonl`` (``"split": "warm_start"``: the file's absolute path, its sha256 and
the per-part counts; :func:`recorded_warm_start`), which a resume keeps and ``summary.json`` repeats. Runs
trained before that have no record: the export counts again against the file (:func:`warm_start_counts`,
by the same rule). The export keeps the counts in its ``metrics.json`` (``"warm_start"``), which a later
export of that directory carries over.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Mapping
from pathlib import Path
from typing import Any

from patchword.checkpoint import weights_file
from patchword.hub import hub_revision
from patchword.runs.files import METRICS_FILE

__all__ = [
    "PARTS",
    "WARM_START_SPLIT",
    "encoder_origins",
    "encoder_kinds",
    "part_counts",
    "pin_hub_revisions",
    "recorded_warm_start",
    "warm_start_counts",
    "warm_start_line",
]

#: The model's parts, as state-dict prefixes, and how the card names them.
PARTS = {"image_encoder": "image encoder", "text_encoder": "text encoder", "matcher": "matcher"}

#: The ``split`` of the record a warm-started run writes first into its ``metrics.jsonl``.
WARM_START_SPLIT = "warm_start"


def part_counts(model_keys: Iterable[str], loaded: Container[str]) -> dict[str, list[int]]:
    """``{part: [loaded, total]}``: per state-dict prefix (``image_encoder``, ...) of ``model_keys``, how many
    of its tensors are in ``loaded`` and how many it has."""
    counts: dict[str, list[int]] = {}
    for key in model_keys:
        entry = counts.setdefault(key.split(".", 1)[0], [0, 0])
        entry[0] += int(key in loaded)
        entry[1] += 1
    return counts


def recorded_warm_start(run_dir: str | Path) -> dict[str, Any] | None:
    """The warm start the run in ``run_dir`` recorded when training started (the first record of its
    ``metrics.jsonl``): ``{"init_from": absolute path, "sha256": str | None, "tensors": {part: [loaded,
    total]}}``; None for a run without one, trained before runs recorded it, or whose record is unreadable.
    Reads the log's first lines only: the record precedes every step's."""
    try:
        with open(Path(run_dir) / METRICS_FILE, encoding="utf-8") as log:
            for line in log:
                if not line.strip():
                    continue
                record = json.loads(line)
                if not isinstance(record, dict) or record.get("split") != WARM_START_SPLIT:
                    return None  # a step's record first: this run recorded no warm start
                tensors = record.get("tensors")
                valid = isinstance(tensors, Mapping) and all(
                    isinstance(v, list) and len(v) == 2 and all(type(n) is int for n in v)
                    for v in tensors.values()
                )
                if not valid or not isinstance(record.get("init_from"), str):
                    return None
                return {"init_from": record["init_from"], "sha256": record.get("sha256"), "tensors": tensors}
    except (OSError, ValueError):  # no log, or a line torn by a kill: nothing recorded to read
        return None
    return None


def _tensor_shapes(path: Path) -> dict[str, tuple[int, ...]] | None:
    """Name -> shape of the weights at ``path`` as ``warm_start`` reads them (a checkpoint's ``model``, a
    ``.safetensors`` file, an export directory or a run directory holding one), without loading the tensors;
    None when there is nothing readable there."""
    path = weights_file(path)
    if not path.is_file():
        return None
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt") as weights:
                return {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}  # noqa: SIM118
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - a file warm_start could not read either: nothing is counted
        return None
    model = state.get("model") if isinstance(state, dict) else None
    if not isinstance(model, Mapping):
        return None
    return {str(k): tuple(v.shape) for k, v in model.items() if hasattr(v, "shape")}


def warm_start_counts(
    model_shapes: Mapping[str, Any], init_from: str, *, run_dir: str | Path | None = None
) -> dict[str, Any]:
    """What ``train.init_from`` = ``init_from`` supplied to a model whose state dict has ``model_shapes``
    (name -> tensor or shape): ``{"init_from": path, "tensors": {part: [loaded, total]} }`` for each of
    :data:`PARTS` the model has (the tensors whose name and shape match the file's, as ``warm_start``
    loaded them). What the run in ``run_dir`` recorded when it started (:func:`recorded_warm_start`; its
    absolute path) comes first; without a record (a run trained before runs recorded it) the file is
    counted again, read from the working directory as training read it, and ``"tensors"`` is None when
    no weights can be read at that path now."""
    recorded = recorded_warm_start(run_dir) if run_dir is not None else None
    if recorded is not None:
        return {"init_from": recorded["init_from"], "tensors": recorded["tensors"]}
    found = _tensor_shapes(Path(init_from))
    if found is None:
        return {"init_from": init_from, "tensors": None}
    shapes = {key: tuple(getattr(value, "shape", value)) for key, value in model_shapes.items()}
    return {
        "init_from": init_from,
        "tensors": part_counts(shapes, {k for k in shapes if found.get(k) == shapes[k]}),
    }


def _architecture(backbones: Mapping[str, Any], role: str) -> str | None:
    """The ``model_type`` ``backbones.json`` records for ``role`` (``vision`` / ``text``), or None."""
    entry = backbones.get(role)
    kind = entry.get("model_type") if isinstance(entry, Mapping) else None
    return kind if isinstance(kind, str) and kind else None


def pin_hub_revisions(
    architectures: Mapping[str, Mapping[str, Any]], roles: Iterable[str] | None = None
) -> dict[str, dict[str, Any]]:
    """``backbones.json``'s ``{role: Hugging Face config dict}`` with, for each of ``roles`` (default: every
    one) read from a hub id (its ``_name_or_path``), the commit of the cached snapshot that id names now
    (``_commit_hash``: transformers' own key for it, which rebuilding the architecture ignores): which
    revision a trained or imported run's backbone came from, for its card and for anyone rebuilding it once
    the id's ``main`` has moved on. A local directory's architecture is left as it is."""
    pinned = {role: dict(architecture) for role, architecture in architectures.items()}
    for role in pinned if roles is None else roles:
        commit = hub_revision(pinned[role].get("_name_or_path"))
        if commit is not None:
            pinned[role]["_commit_hash"] = commit
    return pinned


def encoder_kinds(mc, backbones: Mapping[str, Any]) -> dict[str, str]:
    """``{"image": ..., "text": ...}``: what each encoder is, in a few words (``tiny ViT``, ``Hugging Face
    `vit```, ``region encoder over precomputed features``, ``Bi-GRU``). ``mc``: the run's ``ModelConfig``;
    ``backbones``: its ``backbones.json`` (the Hugging Face architectures)."""
    image = {
        "tiny": "tiny ViT",
        "precomp": "region encoder over precomputed features",
    }.get(mc.image_encoder) or f"Hugging Face `{_architecture(backbones, 'vision') or mc.hf_vision}`"
    gru = "Bi-GRU" if mc.gru.bidirectional else "GRU"
    text = {"tiny": "tiny transformer", "gru": gru}.get(mc.text_encoder) or (
        f"Hugging Face `{_architecture(backbones, 'text') or mc.hf_text}`"
    )
    return {"image": image, "text": text}


def _imported(imported: Mapping[str, Any], part: str, mc, backbones: Mapping[str, Any]) -> str:
    """An imported encoder: its tensors from the official checkpoint, its architecture from where."""
    sha = str(imported.get("source_sha256") or "")[:16]
    line = f"weights from the official `{imported.get('family')}` checkpoint" + (
        f" (sha256 `{sha}`; `import.json`)" if sha else " (`import.json`)"
    )
    derived = [k for k in imported.get("derived") or {} if str(k).startswith(part + ".")]
    if derived:
        line += f", {len(derived)} of its tensors built from the checkpoint's opt"
    role, hf = (
        ("vision", mc.image_encoder == "hf")
        if part == "image_encoder"
        else ("text", mc.text_encoder == "bert")
    )
    if hf and _architecture(backbones, role):
        line += (
            "; architecture recorded in `backbones.json` (the directory given to the import supplied no "
            "weights)"
        )
    elif hf:
        line += "; architecture only from the directory given to the import (it supplied no weights)"
    return line


_PRETRAINED = "initialised from the pretrained tiny encoders `{}` (model.tiny_pretrained)"


def _hub(source: str, key: str, backbones: Mapping[str, Any], role: str) -> str:
    """A Hugging Face backbone's origin: ``source`` (config key ``key``) and, for a hub id, the commit of
    the snapshot the run loaded (``backbones.json``'s ``_commit_hash``; runs before it was recorded: none)."""
    entry = backbones.get(role)
    commit = entry.get("_commit_hash") if isinstance(entry, Mapping) else None
    at = f" at revision `{commit}`" if isinstance(commit, str) and commit else ""
    return f"architecture and initial weights from Hugging Face `{source}`{at} ({key})"


def _initial(part: str, mc, backbones: Mapping[str, Any]) -> str:
    """Where a trained run's encoder started, before any warm start."""
    if part == "image_encoder":
        if mc.image_encoder == "hf":
            return _hub(mc.hf_vision, "model.hf_vision", backbones, "vision")
        if mc.image_encoder == "tiny" and mc.tiny_pretrained:
            return _PRETRAINED.format(mc.tiny_pretrained)
        if mc.image_encoder == "precomp":
            return "trained from scratch (the region features are the data's)"
        return "trained from scratch"
    if mc.text_encoder == "bert":
        return _hub(mc.hf_text, "model.hf_text", backbones, "text")
    if mc.text_encoder == "tiny" and mc.tiny_pretrained:
        return _PRETRAINED.format(mc.tiny_pretrained)
    if mc.text_encoder == "gru" and mc.gru.glove_path:
        return (
            f"word embeddings from GloVe `{mc.gru.glove_path}` (model.gru.glove_path), the rest from scratch"
        )
    return "trained from scratch"


def _warmed(base: str, part: str, warm: Mapping[str, Any] | None) -> str:
    """``base`` (where the encoder started) with what the warm start overwrote of it."""
    if not warm:
        return base
    where = f"`{warm.get('init_from')}` (train.init_from)"
    tensors = warm.get("tensors")
    if not isinstance(tensors, Mapping):
        return (
            f"{base}, then warm-started from {where} for every tensor whose name and shape matched (not "
            "counted: no weights could be read at that path on export)"
        )
    loaded, total = tensors.get(part) or (0, 0)
    if total and loaded == total:
        return f"warm-started from {where}: all {total} of its tensors"
    if loaded:
        return f"warm-started from {where}: {loaded} of its {total} tensors; the others {base}"
    return f"{base} (the warm start {where} matched none of its tensors)"


def encoder_origins(
    mc, imported: Mapping[str, Any], backbones: Mapping[str, Any], warm: Mapping[str, Any] | None
) -> dict[str, str]:
    """``{"image": ..., "text": ...}``: where each encoder's weights came from, in words. ``imported``: the
    run's ``import.json`` (``{}`` for a trained run); ``warm``: :func:`warm_start_counts` of its
    ``train.init_from`` (None without one)."""
    found = {}
    for part, key in (("image_encoder", "image"), ("text_encoder", "text")):
        if imported:
            found[key] = _imported(imported, part, mc, backbones)
        else:
            found[key] = _warmed(_initial(part, mc, backbones), part, warm)
    return found


def warm_start_line(warm: Mapping[str, Any] | None) -> str | None:
    """The Training section's line for a warm start (None without one): the file and, per part of the
    model, how many of its tensors it supplied."""
    if not warm:
        return None
    line = (
        f"* warm start: `{warm.get('init_from')}` (train.init_from), loaded over the encoders' initialisation"
    )
    tensors = warm.get("tensors")
    if not isinstance(tensors, Mapping):
        return (
            line
            + ": every tensor whose name and shape matched (not counted: no weights at that path on export)"
        )
    loaded = sum(int(v[0]) for v in tensors.values())
    total = sum(int(v[1]) for v in tensors.values())
    parts = ", ".join(
        f"{PARTS.get(part, part)} {v[0]} of {v[1]}" for part, v in tensors.items() if part in PARTS or v[0]
    )
    rest = "; the others kept their initialisation" if loaded < total else ""
    return line + f": {loaded} of the model's {total} tensors ({parts}){rest}"
