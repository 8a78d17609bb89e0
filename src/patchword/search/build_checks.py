"""The checks of a build's settings (:func:`patchword.search.index.plan_build`): each value in its range,
and against the model and the index it builds on. Every one raises before anything is written, naming its
flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from patchword.errors import ConfigError
from patchword.runs import LoadedRun
from patchword.search.checks import DENSE_STORES
from patchword.search.codecs import PQ_MIN_TOKENS
from patchword.search.fidelity import reads_index_dense
from patchword.search.manifest import DTYPES, Manifest
from patchword.search.pruning import pruning_record

__all__ = [
    "check_dense_read",
    "check_dense_scores",
    "check_pq_bytes",
    "check_pq_sample",
    "check_settings",
    "check_workers",
    "kept_patches",
]


def check_settings(
    dtype: str | None,
    batch_size: int,
    shard_size: int,
    workers: int | None,
    pq_bytes: int | None,
    dense_store: str | None,
) -> None:
    """The settings that need neither the model nor the index, each in its range."""
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError("--store", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if batch_size < 1:
        raise ConfigError("--batch-size", f"must be at least 1, got {batch_size}")
    if shard_size < 1:
        raise ConfigError("--shard-size", f"must be at least 1, got {shard_size}")
    check_workers(workers)
    if pq_bytes is not None and (dtype != "pq" or pq_bytes < 1):
        raise ConfigError(
            "--pq-bytes", "sets the pq store's bytes per token: give --store pq and a positive count"
        )
    if dense_store is not None and dense_store not in DENSE_STORES:
        raise ConfigError("--dense-store", f"must be one of {', '.join(DENSE_STORES)}, got {dense_store!r}")


def check_workers(workers: int | None, flag: str = "--decode-workers") -> None:
    """The count of decoding threads: 0 or more (None, 0: the default). ``flag``: the spelling the command
    line gave it (``--decode-workers``, or its old, hidden ``--workers``)."""
    if workers is not None and workers < 0:
        raise ConfigError(flag, f"must be 0 (the default: min(4, CPUs)) or more, got {workers}")


def check_pq_bytes(
    pq_bytes: int | None, identity: dict[str, Any], manifest: Manifest, index_dir: Path
) -> None:
    """``--pq-bytes`` against the model's token width and the bytes per token an existing index stores."""
    if pq_bytes is None:
        return
    if identity["embed_dim"] % pq_bytes:
        raise ConfigError(
            "--pq-bytes",
            f"{pq_bytes} sub-quantisers do not divide the model's {identity['embed_dim']}-d tokens",
        )
    kept_m = (manifest.codec or {}).get("pq_m")
    if kept_m is not None and kept_m != pq_bytes:
        raise ConfigError(
            "--pq-bytes", f"{index_dir} stores {kept_m} bytes per token; build a new index to change it"
        )


def check_pq_sample(identity: dict[str, Any], first_shard: int, with_dense: bool) -> None:
    """Refuse a pq store whose first shard (``first_shard`` images) cannot hold the tokens its quantiser
    needs (checked again, exactly, on the encoded shard: an image may still fail to decode)."""
    per_image = identity["image_tokens"] + (identity["max_dense_len"] if with_dense else 0)
    if first_shard * per_image < PQ_MIN_TOKENS:
        raise ConfigError(
            "--store",
            f"pq trains its quantiser on the first shard's tokens and needs at least {PQ_MIN_TOKENS}; the "
            f"first shard's {first_shard} images give at most {first_shard * per_image}: index more images "
            "or choose another --store",
        )


def kept_patches(manifest: Manifest, engine, keep_patches: float | None, index_dir: Path) -> int | None:
    """Patches kept per image (None: all), recording a new index's choice in ``manifest``; refuses a
    choice that differs from an existing index's."""
    if manifest.shards or manifest.entries:  # an existing index keeps what it was built with
        had = manifest.pruning
        if keep_patches is not None and (had is None or had["fraction"] != keep_patches):
            kept = f"keeps {had['fraction']} of its patches" if had else "keeps every patch"
            raise ConfigError("--keep-patches", f"{index_dir} {kept}; build a new index to change it")
        return None if had is None else int(had["kept"])
    manifest.pruning = None
    if keep_patches is None:
        return None
    record = pruning_record(engine, keep_patches)  # validates the fraction and that the matcher can prune
    if record["kept"] == record["of"]:
        return None  # every patch kept: an index like any other
    manifest.pruning = record
    return int(record["kept"])


def _reads_no_dense(run: LoadedRun, fine) -> str:
    """Why ``run``'s fine matcher ``fine`` reads no index dense text: the end of a refusal's line."""
    why = (
        f"dense_pairing={fine.dense_pairing} ties its dense text to captions, and a search query has none"
        if fine.consumes_dense
        else "it ignores dense text"
    )
    return (
        f"{run.run_dir}'s matcher ({run.config.model.matcher}) reads no dense captions at search time ({why})"
    )


def check_dense_read(run: LoadedRun, fine, dense_given: bool, dense_store: str | None) -> None:
    """``--dense`` / ``--dense-store scores`` for a run whose fine matcher ``fine`` would never read what they
    store (:func:`reads_index_dense`): refused rather than stored unread (dense tokens, a large part of each
    image's rows, or dense scores no search looks at)."""
    if reads_index_dense(fine):
        return
    if dense_given:
        raise ConfigError("--dense", f"{_reads_no_dense(run, fine)}: build the index without --dense")
    if dense_store == "scores":
        raise ConfigError("--dense-store", f"scores: {_reads_no_dense(run, fine)}: leave --dense-store out")


def _has_dense_scores(engine, identity: dict[str, Any], device: torch.device) -> bool:
    """Whether the fine matcher's dense part is one number per image (probed on one zero image, on
    ``device``: where the matcher's weights are; a CPU probe of a matcher on an accelerator would mix
    devices)."""
    image = torch.zeros(1, identity["image_tokens"], identity["embed_dim"])
    dense = torch.zeros(1, 2, identity["embed_dim"])
    return engine.image_constants(image, dense, torch.tensor([2]), device=device) is not None


def check_dense_scores(engine, identity: dict[str, Any], run: LoadedRun, fine) -> None:
    """``--dense-store scores``: refused for a fine matcher ``fine`` (the one ``engine`` scores with) that
    reads no index dense text (:func:`check_dense_read`), or whose dense part is not one number per image."""
    check_dense_read(run, fine, False, "scores")
    if not _has_dense_scores(engine, identity, run.device):
        raise ConfigError(
            "--dense-store",
            f"scores: {run.run_dir}'s matcher ({run.config.model.matcher}) has no per-image dense score "
            "(its dense text enters every pair's selection, as in SEPS's paper variant): use --dense-store "
            "tokens",
        )
