"""What the cost table's caption of ``patchword report`` warns of (:func:`patchword.experiments.cost.
cost_rows`): several machines or test galleries, and the rows marked in it (MIXED, LEAKY, INCOMPLETE, and
the marks every table shares). Functions take the report's rows without importing them."""

from __future__ import annotations

from patchword.experiments.machines import mixed_machines, mixed_training
from patchword.experiments.rows import is_incomplete, is_leaky, shared_flags

__all__ = ["caption_flags"]


def caption_flags(entries, machines: set[str], galleries: set[str]) -> str:
    """What the cost caption must warn of: several machines or galleries, and the rows marked in it."""
    flags = ""
    if len(machines) > 1:
        flags += (
            f"; {len(machines)} MACHINES: times measured on different devices or CPUs are not comparable, "
            "each row is ranked only against the rows of its own machine"
        )
    if any(mixed_machines(e) for e in entries):
        flags += (
            "; MIXED: a row whose runs were evaluated on different machines: its times and memory are not "
            "averaged (each run's summary.json has its own) and it is on no front"
        )
    if any(mixed_training(e) for e in entries):
        flags += (
            "; MIXED train machine: a row whose training sessions ran on different machines (a run resumed "
            "with other threads or another device): its train s adds them up, its steps/s is not shown"
        )
    if len(galleries) > 1:
        flags += (
            f"; {len(galleries)} TEST GALLERIES [{'; '.join(sorted(galleries))}]: rSum depends on the "
            "gallery, each row is ranked only against the rows measured on its own"
        )
    if any(is_leaky(e) for e in entries):
        flags += (
            "; LEAKY: queries carry dense text generated from their own target image (official SEPS "
            "protocol), ranked only against other leaky rows"
        )
    if any(is_incomplete(e) for e in entries):
        flags += (
            "; INCOMPLETE: a sweep variant with seeds it was asked for not finished, its figures over the "
            "finished seeds only"
        )
    return flags + shared_flags(entries)
