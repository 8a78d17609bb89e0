"""Images shared by two splits of a run: a test (or dev) split that holds training images is no held-out
split, and its figures would be reported as held-out results (``split_use`` null).

Reusing a split on purpose is naming it: ``data.test_split=train`` or ``data.test_split=dev`` reads the
same files, and the run records and warns that its test split is not held out. Two roles that read the
same split are therefore never compared here, nor the dev split that ``data.dev_from_train`` holds out of
the training split (disjoint by construction). Two roles that read *different* files sharing an image are
refused: that overlap is an accident (a file of the wrong split, a misbuilt split).

What identifies an image: the dataset id (LAPS ids, COCO ids / Karpathy indices, each qualified by the
field it was read from: COCO id 5 is not Karpathy index 5) and, for image files, the normalised file path;
SCAN region features only by their ids file (without one on both sides the rows are positions, and nothing
identifies an image). Generated (synthetic) splits are not compared.

A job that reads only some roles (``patchword eval`` reads the split it scores, ``data check --split
test`` one split) still compares them with the splits they must be held out from: those are read as text
only (their ids files, id mapping or json entries; no image is decoded, no feature file opened). One that
cannot be read (an evaluation data root without training files) is not compared, and the log says so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import numpy as np

from patchword.data.config import DataConfig
from patchword.data.karpathy import karpathy_split_name
from patchword.data.split import RetrievalSplit
from patchword.errors import USER_ERRORS, DataError

__all__ = ["split_source", "refuse_shared_images"]

_logger = logging.getLogger(__name__)

#: A Karpathy json's split name -> that split (:func:`~patchword.data.karpathy.karpathy_split_reader`).
KarpathyReader = Callable[[str], RetrievalSplit]

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


def _keys(dc: DataConfig, role: str, split: RetrievalSplit) -> list[tuple[str, list[str], list[str]]]:
    """``(what, key of each image, how each is shown)`` triples that identify the images of ``split``:
    ids (qualified by the field they were read from, shown bare), then files."""
    ids = ("id", split.image_keys(), list(split.image_ids))
    if dc.dataset == "precomp":
        return [ids] if _ids_file(dc, role).is_file() else []
    files = [os.path.normpath(os.fspath(path)) for path in split.images]
    return [ids, ("file", files, files)]


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


def _first_shared(dc: DataConfig, splits: Mapping[str, RetrievalSplit], roles: Collection[str]) -> str | None:
    """The message naming both places of the first image that one of ``roles`` shares with a split it
    must be held out from (in the role's order), None when none does. ``splits``: the loaded roles and
    those read to compare with (:func:`listed_images`)."""
    if dc.dataset not in ("laps", "karpathy", "precomp"):
        return None
    for role, other in _PAIRS:
        if role not in roles or other not in splits or _same_source(dc, role, other):
            continue
        mine, theirs = splits[role], splits[other]
        their_keys_of = {what: keys for what, keys, _ in _keys(dc, other, theirs)}
        for what, keys, shown in _keys(dc, role, mine):
            if what not in their_keys_of:  # precomp: an ids file on one side only
                continue
            position = {key: j for j, key in enumerate(their_keys_of[what])}
            hit = next((i for i, key in enumerate(keys) if key in position), None)
            if hit is None:
                continue
            j = position[keys[hit]]
            here, there = _place(dc, role, mine, hit), _place(dc, other, theirs, j)
            return (
                f"{here}: image {what} {shown[hit]!r} of the {role} split is also image {j} of the {other} "
                f"split ({there}): a {role} split sharing images with the {other} split is not held out from "
                f"it; {_advice(dc, role, other)}"
            )
    return None


def listed_images(
    dc: DataConfig, splits: Mapping[str, RetrievalSplit], karpathy: KarpathyReader | None = None
) -> dict[str, RetrievalSplit]:
    """The roles that the loaded ``splits`` must be held out from but that were not loaded, read as text
    only: their ids and file names (LAPS: the ids file and id mapping, captions too; Karpathy: the json's
    entries, parsed once; SCAN: the ids file alone, no features), no image decoded.

    A split that cannot be read (no such files, a malformed one) is left out, logged: the roles loaded
    were read for a job that does not need it. ``karpathy``: the loader's reader of the json
    (:func:`~patchword.data.karpathy.karpathy_split_reader`), so that it is not parsed again.
    """
    if dc.dataset not in ("laps", "karpathy", "precomp"):
        return {}
    wanted, checked = {}, []  # role -> split name (each name read once); the loaded roles compared
    for role, other in _PAIRS:
        if role in splits and other not in splits and not _same_source(dc, role, other):
            if role not in checked:
                checked.append(role)
            if split_source(dc, other) not in wanted.values():
                wanted[other] = split_source(dc, other)
    if not wanted:
        return {}
    _logger.info(
        "checking the %s for images shared with the %s: reading the latter's ids and file names",
        _splits(checked),
        _splits(list(wanted.values())),
    )
    if dc.dataset == "karpathy" and karpathy is None:  # parsed once for every split read
        from patchword.data.karpathy import karpathy_split_reader

        try:
            karpathy = karpathy_split_reader(dc.root, dc.image_root)
        except USER_ERRORS as err:
            _not_compared(dc, list(wanted), checked, err)
            return {}
    listed = {}
    for role, name in wanted.items():
        try:
            split = karpathy(name) if karpathy is not None else _listed_split(dc, role, name)
        except USER_ERRORS as err:
            _not_compared(dc, [role], checked, err)
            continue
        if split is not None:
            listed[role] = split
    return listed


def _listed_split(dc: DataConfig, role: str, name: str) -> RetrievalSplit | None:
    """One split of a LAPS or SCAN layout as its text files list its images (None: SCAN without ids)."""
    if dc.dataset == "laps":
        from patchword.data.laps import load_laps_split

        # no count is checked: only which images the split holds matters here
        return load_laps_split(dc.root, name, dc.image_root, check_images=False, captions_per_image=None)
    from patchword.data.textfiles import read_lines

    ids_file = _ids_file(dc, role)
    if not ids_file.is_file():  # rows are positions: nothing identifies an image (see _keys)
        return None
    # one id per image or per caption (in runs): the images are the distinct ids in order either way
    ids = list(dict.fromkeys(read_lines(ids_file, "image id")))
    return RetrievalSplit(name=name, images=ids, captions=[], txt2img=np.zeros(0, np.int64), image_ids=ids)


def _not_compared(dc: DataConfig, roles: list[str], checked: list[str], err: Exception) -> None:
    """Log that the loaded roles ``checked`` are not checked against ``roles``, which cannot be read (a
    missing file is an evaluation root without training files: said at INFO level)."""
    level = logging.INFO if isinstance(err, FileNotFoundError) else logging.WARNING
    _logger.log(
        level,
        "the %s not checked for images shared with the %s, which cannot be read: %s",
        _splits(checked) + (" is" if len(checked) == 1 else " are"),
        _splits([split_source(dc, role) for role in roles]),
        err,
    )


def _splits(names: list[str]) -> str:
    """``the train split`` style words for split names: ``train split``, ``train and dev splits``."""
    if len(names) == 1:
        return f"{names[0]} split"
    return f"{', '.join(names[:-1])} and {names[-1]} splits"


def refuse_shared_images(
    dc: DataConfig, splits: Mapping[str, RetrievalSplit], karpathy: KarpathyReader | None = None
) -> None:
    """Refuse loaded roles that read different splits sharing an image (see the module docstring),
    reading the ids and file names of the roles they must be held out from when those are not loaded
    (:func:`listed_images`).

    Raises:
        DataError: naming both files (and lines) of the first shared image.
    """
    listed = listed_images(dc, splits, karpathy)
    found = _first_shared(dc, {**listed, **splits}, roles=set(splits))
    if found is not None:
        raise DataError(found)
