"""The random streams of a run's processes: every process draws its in-model randomness (Gumbel noise,
dropout) from a stream of its own; ``last.pt`` keeps every process's RNG states and a resume restores them.
"""

from __future__ import annotations

from typing import Any

import torch

from patchword.checkpoint import rng_state, set_rng_state
from patchword.distributed import Distributed

__all__ = ["rank_rng_states", "restore_rng", "seed_model_stream"]


def seed_model_stream(seed: int, rank: int, step: int = 0) -> None:
    """Seed process ``rank``'s in-model stream (a new one from ``step`` on)."""
    torch.manual_seed(seed * 1_000_003 + 7919 * (rank + 1) + step)


def restore_rng(state: dict[str, Any], dist: Distributed, seed: int, step: int) -> int | None:
    """This process's RNG states from the checkpoint ``state`` written at ``step``.

    Returns:
        None, or the number of processes that wrote ``state`` when it differs from this run's: each
        process then continues from a new in-model stream (the batches are unchanged).
    """
    ranks = state.get("rng_ranks") or [state["rng"]]
    if len(ranks) == dist.world_size:
        set_rng_state(ranks[dist.rank])
        return None
    set_rng_state(state["rng"])
    seed_model_stream(seed, dist.rank, step)
    return len(ranks)


def rank_rng_states(dist: Distributed) -> dict[str, Any]:
    """``last.pt``'s RNG entries: this process's states (``rng``), every process's (``rng_ranks``: every
    process must call it) and their number (``world_size``)."""
    return {
        "rng": rng_state(),
        "rng_ranks": dist.all_gather_object(rng_state()),
        "world_size": dist.world_size,
    }
