"""Images shared by two splits of a run: a test (or dev) split that holds training images is no held-out
split, and its figures would be reported as held-out results (``split_use`` null).

Reusing a split on purpose is naming it: ``data.test_split=train`` or ``data.test_split=dev`` reads the
same files, and the run records and warns that its test split is not held out. Two roles that read the
same split are therefore never compared here, nor the dev split that ``data.dev_from_train`` holds out of
the training split (disjoint by construction). Two roles that read *different* files sharing an image are
refused: that overlap is an accident (a file of the wrong split, a misbuilt split).

What identifies an image: the dataset id (LAPS ids, COCO ids / Karpathy indices) and, for image files,
the normalised file path; SCAN region features only by their ids file (without one on both sides the
rows are positions, and nothing identifies an image). Generated (synthetic) splits are not compared.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from patchword.data.config import DataConfig
from patchword.data.karpathy import karpathy_split_name
from patchword.data.split import RetrievalSplit
from patchword.errors import DataError

__all__ = ["split_source", "shared_images", "refuse_shared_images"]

#: Role pairs compared, the later role first: its images must not be the earlier one's.
_PAIRS = (("dev", "train"), ("test", "train"), ("test", "dev"))


def split_source(dc: DataConfig, role: str) -> str:
    """The split name whose files ``role`` reads: ``data.{role}_split``, or the training split for the dev
    split that ``data.dev_from_train`` holds out of it."""
    if role == "dev" and dc.dev_from_train:
        return dc.train_split
    return getattr(dc, f"{role}_split")


def _same_source(dc: DataConfig, a: str, b: str) -> bool:
    sa, sb = split_source(dc, a), split_source(dc, b)
    if dc.dataset == "karpathy":
        sa, sb = karpathy_split_name(sa), karpathy_split_name(sb)
    return sa == sb


def _ids_file(dc: DataConfig, role: str) -> Path:
    return Path(dc.root).expanduser() / f"{split_source(dc, role)}_ids.txt"


def _keys(dc: DataConfig, role: str, split: RetrievalSplit) -> list[tuple[str, list[str]]]:
    """``(what, key of each image)`` pairs that identify the images of ``split``: ids, then files."""
    if dc.dataset == "precomp":
        return [("id", list(split.image_ids))] if _ids_file(dc, role).is_file() else []
    files = [os.path.normpath(os.fspath(path)) for path in split.images]
    return [("id", list(split.image_ids)), ("file", files)]


def _place(dc: DataConfig, role: str, split: RetrievalSplit, image: int) -> str:
    """Where image ``image`` of ``split`` is listed: ``IDS_FILE:LINE`` or ``JSON: images[i]``."""
    origin = split.caption_origin
    if dc.dataset == "karpathy" and origin is not None:  # places: (N_txt, 2) (entry, sentence)
        first_caption = int(np.flatnonzero(split.txt2img == image)[0])
        return f"{origin.file}: images[{int(origin.places[first_caption][0])}]"
    path = _ids_file(dc, role)
    image_id = split.image_ids[image]
    with path.open(encoding="utf-8-sig") as f:  # only on the error path: the line of the id
        for lineno, line in enumerate(f, start=1):
            if line.strip() == image_id:
                return f"{path}:{lineno}"
    return str(path)


def _advice(dc: DataConfig, role: str, other: str) -> str:
    if other == "dev" and not dc.dev_from_train:  # a held-out dev split is training images
        on_purpose = f"set data.test_split={dc.dev_split} to score the split the checkpoint is chosen on"
    elif role == "test":
        on_purpose = f"set data.test_split={dc.train_split} to score the training split"
    elif dc.dataset in ("laps", "karpathy"):
        return (
            "take the shared images out of one split, or validate on training images held out with "
            "data.dev_from_train=N"
        )
    else:
        return "take the shared images out of one split"
    return f"take the shared images out of one split, or {on_purpose} on purpose (its records then say so)"


def shared_images(dc: DataConfig, splits: Mapping[str, RetrievalSplit]) -> list[tuple[str, str]]:
    """``(role, message)`` for each pair of loaded roles that read different splits sharing an image,
    the message naming both places of the first shared image (in the later role's order)."""
    if dc.dataset not in ("laps", "karpathy", "precomp"):
        return []
    found = []
    for role, other in _PAIRS:
        if role not in splits or other not in splits or _same_source(dc, role, other):
            continue
        mine, theirs = splits[role], splits[other]
        their_keys_of = dict(_keys(dc, other, theirs))
        for what, keys in _keys(dc, role, mine):
            if what not in their_keys_of:  # precomp: an ids file on one side only
                continue
            position = {key: j for j, key in enumerate(their_keys_of[what])}
            hit = next((i for i, key in enumerate(keys) if key in position), None)
            if hit is None:
                continue
            j = position[keys[hit]]
            here, there = _place(dc, role, mine, hit), _place(dc, other, theirs, j)
            message = (
                f"{here}: image {what} {keys[hit]!r} of the {role} split is also image {j} of the {other} "
                f"split ({there}): a {role} split sharing images with the {other} split is not held out from "
                f"it; {_advice(dc, role, other)}"
            )
            found.append((role, message))
            break
    return found


def refuse_shared_images(dc: DataConfig, splits: Mapping[str, RetrievalSplit]) -> None:
    """Refuse loaded roles that read different splits sharing an image (see the module docstring).

    Raises:
        DataError: naming both files (and lines) of the first shared image.
    """
    found = shared_images(dc, splits)
    if found:
        raise DataError(found[0][1])
