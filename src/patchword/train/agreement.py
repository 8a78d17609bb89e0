"""What the processes of a ``torchrun`` launch must agree on before they act on it: the config they run,
and the checkpoint the final evaluation reads (docs/distributed.md).

Every process runs the same command with its own copy of the config, and reads ``best.pt`` back from the
run directory rank 0 writes. A process started with another value (a per-node config file, a forgotten
override) would train silently with it while ``config.yaml`` records rank 0's, or fail in a collective
without naming the key; one on a node that does not share the run directory would evaluate its own
weights. Both are refused here with one error on every process.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from patchword.checkpoint import load_checkpoint
from patchword.config import flat_config
from patchword.distributed import Distributed, DistributedError
from patchword.errors import ConfigError
from patchword.fileio import file_sha256
from patchword.runs.config import RunConfig
from patchword.runs.files import BEST_CHECKPOINT, LAST_CHECKPOINT

__all__ = ["checkpoint_to_evaluate", "refuse_differing_configs"]

_MISSING = "<unset>"


def refuse_differing_configs(
    cfg: RunConfig, dist: Distributed, overrides: Sequence[str] | None = None
) -> None:
    """Every process's resolved ``cfg`` (and ``--resume`` ``overrides``) must be rank 0's: one gather of
    them all, then the same :class:`ConfigError` on every process, naming the first differing dotted key
    (in the config's order), the first rank that differs and both values. Nothing with one process.
    """
    if not dist.enabled:
        return
    said: list[tuple[dict[str, Any], list[str] | None]] = dist.all_gather_object(
        (flat_config(cfg), None if overrides is None else list(overrides))
    )
    main = said[0][0]
    keys = [*main, *(key for flat, _ in said[1:] for key in flat if key not in main)]
    for key in keys:
        for rank, (flat, _) in enumerate(said[1:], 1):
            if flat.get(key, _MISSING) != main.get(key, _MISSING):
                raise ConfigError(key, _differs(dist, rank, flat.get(key, _MISSING), main.get(key, _MISSING)))
    for rank, (_, given) in enumerate(said[1:], 1):
        if given != said[0][1]:
            raise ConfigError(
                "--resume", _differs(dist, rank, given, said[0][1], "resumes with the overrides")
            )


def _differs(dist: Distributed, rank: int, theirs: Any, main: Any, does: str = "runs with") -> str:
    return (
        f"rank {rank} of {dist.world_size} {does} {theirs!r}, rank 0 with {main!r}: every process of a "
        "launch must run the same config (the same command, config file and overrides on every node)"
    )


def checkpoint_to_evaluate(
    run_dir: Path, dist: Distributed
) -> tuple[Path, dict[str, Any] | None, str | None]:
    """The checkpoint whose weights the final evaluation reads, as rank 0 (which wrote the run) sees it:
    ``best.pt``, else ``last.pt``. -> (its path, ``best.pt``'s contents, ``best.pt``'s SHA-256 as rank 0
    read it; None, None for ``last.pt``, whose weights every process holds already: the model's now).

    Rank 0 decides and sends (name, SHA-256); every other process loads the file it names from its own
    view of the run directory, which must be the same file.

    Raises:
        DistributedError: on every process, when one cannot read the file rank 0 evaluates or reads
            other bytes (the run directory is not shared), naming the file.
    """
    choice = None
    if dist.is_main:
        best = run_dir / BEST_CHECKPOINT
        choice = (BEST_CHECKPOINT, file_sha256(best)) if best.is_file() else None
    choice = dist.broadcast_object(choice)
    if choice is None:
        return run_dir / LAST_CHECKPOINT, None, None
    path, digest = run_dir / choice[0], choice[1]
    with dist.fail_together(f"reading {choice[0]}, the checkpoint to evaluate"):
        if not dist.is_main:
            where = f"rank {dist.rank} of {dist.world_size}"
            if not path.is_file():
                raise DistributedError(f"{path}: {where} cannot find the file rank 0 evaluates: {_SHARED}")
            if file_sha256(path) != digest:
                raise DistributedError(f"{path}: {where} reads other bytes than rank 0 evaluates: {_SHARED}")
        state = load_checkpoint(path)
    return path, state, digest


_SHARED = (
    "the run directory must be shared by every process (a filesystem all nodes mount; docs/distributed.md)"
)
