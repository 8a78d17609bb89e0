"""The flags ``patchword search`` and ``patchword serve`` share: ``--shortlist``'s help and ``--first-stage``
(a local index's global shortlist), checked before the model loads."""

from __future__ import annotations

import argparse

from patchword.errors import ConfigError, MissingExtraError

__all__ = ["FIRST_STAGES", "add_first_stage_argument", "check_first_stage", "shortlist_help"]

#: ``--first-stage``: the ``backend`` values of :class:`~patchword.search.query.Searcher`.
FIRST_STAGES = ("auto", "exact", "faiss_flat", "faiss_ivf", "faiss_hnsw")


def shortlist_help() -> str:
    """The help of ``--shortlist`` of ``search`` and ``serve``, with the default of
    :class:`~patchword.search.query.Searcher` (imported here: the commands load it anyway)."""
    from patchword.search.query import DEFAULT_SHORTLIST

    return (
        "images re-ranked per query by the fine matcher (default: the run's two-stage shortlist, else "
        f"{DEFAULT_SHORTLIST})"
    )


def add_first_stage_argument(parser: argparse.ArgumentParser) -> None:
    """``--first-stage`` of ``search`` and ``serve``."""
    parser.add_argument(
        "--first-stage",
        choices=FIRST_STAGES,
        default="auto",
        help="a local index's global shortlist: auto (default: exact up to 200k images, FAISS IVF above), "
        "exact (torch), faiss_flat (exact), faiss_ivf or faiss_hnsw (approximate, built once and kept with "
        "the index)",
    )


def check_first_stage(args: argparse.Namespace) -> None:
    """``--first-stage`` before the model loads: a FAISS one needs FAISS; with ``--qdrant`` Qdrant ranks
    the shortlist (``--exact`` makes it exact).

    Raises:
        ConfigError: another stage than auto with ``--qdrant``.
        MissingExtraError: a FAISS stage without FAISS installed.
    """
    if args.first_stage == "auto":
        return
    if getattr(args, "qdrant", False):
        raise ConfigError(
            "--first-stage",
            "chooses a local index's shortlist: with --qdrant, Qdrant ranks it (--exact: exactly)",
        )
    from patchword.eval.two_stage import faiss_available

    if args.first_stage.startswith("faiss_") and not faiss_available():
        raise MissingExtraError(f"--first-stage {args.first_stage} needs FAISS: pip install 'patchword[ann]'")
