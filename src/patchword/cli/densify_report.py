"""What ``patchword densify`` tells its user about a job, on stderr: the images done, generated and how
fast, what is still missing and why, merges. stdout is for results in every verb (``densify stats`` prints
its report there); a job's results are its files."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from patchword.densify.runner import DensifyResult

__all__ = ["report_job", "say"]


def say(text: str) -> None:
    """One line (or several) for the user, on stderr."""
    print(text, file=sys.stderr)


def report_job(result: DensifyResult) -> int:
    """Say what a :func:`~patchword.densify.runner.densify` call did; the exit code: 0 complete, 1 images
    still missing (each of the first 20 failures named with its reason)."""
    if result.generated:
        # the loop's time covers a resumed partial batch's images generated again (and not appended) too
        rate = (result.generated + result.regenerated) / max(result.generate_seconds, 1e-9)
        again = (
            f" + {result.regenerated} regenerated to finish a partly written batch"
            if result.regenerated
            else ""
        )
        say(
            f"{result.out}: {result.done} of {result.expected} images ({result.generated} generated now"
            f"{again}: {result.generate_seconds:.1f} s, {rate:.2f} images/s; "
            f"{result.seconds:.1f} s with loading)"
        )
    elif result.failed:
        # the images left were tried again and failed again: "nothing left" would not be true
        unreadable = len(result.failed) - len(result.empty)
        again = [f"{unreadable} unreadable image(s) skipped again"] if unreadable else []
        again += [f"{len(result.empty)} described with nothing again"] if result.empty else []
        say(
            f"{result.out}: {result.done} of {result.expected} images (nothing generated now: "
            f"{', '.join(again)})"
        )
    else:
        say(f"{result.out}: {result.done} of {result.expected} images (nothing left to generate)")
    if result.complete:
        return 0
    shown = ", ".join(result.missing[:20]) + (" ..." if len(result.missing) > 20 else "")
    say(f"incomplete: {len(result.missing)} images missing: {shown}")
    for item, reason in result.failed[:20]:
        say(f"  {item.image_id}: {reason}")
    return 1
