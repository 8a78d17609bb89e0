"""Compositional evaluation: does the true caption outscore a minimally changed one?

Each triple (image, positive caption, negative caption) asks the model one question: the negative differs
from the positive in a single fact (swapped attributes, a reversed relation, a replaced object, a wrong
count), so preferring the positive needs exactly the binding a global embedding tends to blur. The
accuracy of a kind is the percentage of its triples in which the positive scores **strictly** higher
(ties count as wrong; chance is 50).

Two sources of triples:

* the synthetic scenes (:func:`synthetic_suite`), whose generator writes provably false negatives of
  every test caption (:func:`patchword.data.synthetic.hard_negatives`);
* SugarCrepe-style JSON files over real image files (:func:`read_sugarcrepe`).

Only the 2 M pairs that are asked about are scored (each image against its own positives and negatives),
with the matcher's fast exact engine (``engine_for(matcher).score_pairs``); a matcher that consumes dense
text sees each image's own dense caption (image-tied, whichever way the matcher pairs dense text).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from patchword.errors import DataError, MissingFileError
from patchword.eval.engine.base import DEFAULT_MAX_MEMORY_MB
from patchword.eval.engine.core import engine_for, prepare_inputs
from patchword.eval.engine.memory import budget_bytes
from patchword.eval.scoring import encode_image_tokens, encode_text_tokens, eval_mode
from patchword.readers import require_file

__all__ = [
    "CompositionalTriples",
    "DENSE_TEXT_WORDS",
    "accuracy_by_kind",
    "FileImageSource",
    "compositional_accuracy",
    "dense_text_used",
    "format_compositional_table",
    "format_compositional_comparison",
    "read_sugarcrepe",
    "score_triples",
    "synthetic_suite",
]

_logger = logging.getLogger(__name__)


@dataclass(eq=False)
class CompositionalTriples:
    """M (image, positive, negative) triples.

    Attributes:
        image: (M,) int64 index of each triple's image in its image source.
        positive: the M true captions; ``negative``: the M false ones.
        kind: the M kinds (what the negative changes).
        kinds: every kind, in report order (kinds without triples are reported with accuracy None).
        origin: where each triple was read (``FILE: record ID``, for messages); None: generated.
    """

    image: np.ndarray
    positive: list[str]
    negative: list[str]
    kind: list[str]
    kinds: tuple[str, ...]
    origin: list[str] | None = None

    def __post_init__(self) -> None:
        self.image = np.asarray(self.image, np.int64)
        m = len(self.image)
        if not len(self.positive) == len(self.negative) == len(self.kind) == m:
            raise ValueError(
                f"triples need as many positives ({len(self.positive)}), negatives "
                f"({len(self.negative)}) and kinds ({len(self.kind)}) as images ({m})"
            )
        missing = sorted(set(self.kind) - set(self.kinds))
        if missing:
            raise ValueError(f"kinds {missing} of the triples are not among the reported kinds {self.kinds}")

    def __len__(self) -> int:
        return len(self.image)


class _ImageSubset:
    """Images ``index`` of an image source, re-indexed from 0."""

    def __init__(self, images, index: np.ndarray) -> None:
        self.images, self.index = images, torch.as_tensor(index, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.index)

    def batch(self, indices: torch.Tensor, train: bool) -> torch.Tensor:
        return self.images.batch(self.index[indices], train)


class FileImageSource:
    """Image files decoded and preprocessed per batch with a given transform (e.g. a run's
    ``LoadedRun.image_transform()``): an ``ImageSource`` for the scoring functions."""

    def __init__(self, paths: Sequence[str | Path], transform) -> None:
        self.paths = [Path(p) for p in paths]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def batch(self, indices: torch.Tensor, train: bool) -> torch.Tensor:
        from patchword.data.images import load_image

        return torch.stack([self.transform(load_image(self.paths[int(i)])) for i in indices])


# -- scoring ---------------------------------------------------------------------------------------------


@torch.no_grad()
def score_triples(
    model,
    tokenizer,
    images,
    triples: CompositionalTriples,
    *,
    max_caption_len: int,
    max_dense_len: int | None = None,
    dense_captions: Sequence[str] | None = None,
    batch_size: int = 64,
    max_memory_mb: float = DEFAULT_MAX_MEMORY_MB,
    device: torch.device | str = "cpu",
    progress: bool | None = None,
    engine=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of every triple's positive and negative with its own image: two (M,) float32 tensors.

    Each image used by a triple is encoded once, each distinct (image, caption) pair once, and only those
    pairs are scored (``engine_for(matcher).score_pairs``), in eval mode.

    Args:
        model: a :class:`~patchword.model.RetrievalModel` (encoders + matcher) on ``device``.
        tokenizer: its tokenizer (``batch_encode(texts, max_len) -> (ids, lens)``).
        images: an image source (``len`` and ``batch(indices, train) -> (B, 3, H, W)``) that
            ``triples.image`` indexes.
        triples: the triples (:class:`CompositionalTriples` or anything with the same fields, such as
            :class:`~patchword.data.synthetic.HardNegatives`).
        max_caption_len, max_dense_len: token limits of captions and dense captions (the run's).
        dense_captions: one dense caption per image of ``images``; used when the matcher consumes dense
            text (each image with its own). A dense matcher scored without them runs in its sparse mode.
        batch_size: images per encoder batch (texts: twice as many).
        max_memory_mb: working-memory budget of the scoring engine.
        engine: None (the matcher's fast engine) or ``"forward"`` (its forward pass; for tests).
    """
    image_index = np.asarray(triples.image, np.int64)
    if len(image_index) == 0:
        return torch.zeros(0), torch.zeros(0)
    if image_index.min() < 0 or image_index.max() >= len(images):
        raise ValueError(f"triple image indices must lie in [0, {len(images)}), got {image_index.max()}")
    used, row = np.unique(image_index, return_inverse=True)
    # Every distinct (image, caption) pair is one text of its own: that keeps each text tied to one image,
    # as caption-tied dense pairing needs, and a positive shared by several negatives is scored once.
    text_of: dict[tuple[int, str], int] = {}
    pos = [text_of.setdefault((int(r), t), len(text_of)) for r, t in zip(row, triples.positive, strict=True)]
    neg = [text_of.setdefault((int(r), t), len(text_of)) for r, t in zip(row, triples.negative, strict=True)]
    texts = [t for _, t in text_of]
    text_image = torch.tensor([r for r, _ in text_of], dtype=torch.long)

    matcher = model.matcher
    with eval_mode(model):
        img = encode_image_tokens(
            model, _ImageSubset(images, used), batch_size=batch_size, device=device, progress=progress
        )
        ids, lens = tokenizer.batch_encode(texts, max_len=max_caption_len)
        cap = encode_text_tokens(
            model, ids, lens, batch_size=2 * batch_size, device=device, progress=progress
        )
        dense = dense_lens = None
        used_dense = dense_text_used(matcher, dense_captions)
        if used_dense == "none":
            _logger.warning("the matcher consumes dense text but none was given: scoring without it")
        elif used_dense == "image-tied":
            if len(dense_captions) != len(images):
                raise ValueError(f"{len(dense_captions)} dense captions for {len(images)} images")
            dense_ids, dense_lens = tokenizer.batch_encode(
                [dense_captions[i] for i in used], max_len=max_dense_len
            )
            dense = encode_text_tokens(
                model, dense_ids, dense_lens, batch_size=batch_size, device=device, progress=progress
            )
        inputs = prepare_inputs(matcher, img, cap, lens, dense, dense_lens, text_image)
        scores = engine_for(matcher, engine).score_pairs(
            inputs,
            text_image,
            torch.arange(len(texts)),
            budget=budget_bytes(max_memory_mb),
            device=torch.device(device),
            progress=progress,
        )
    return scores[torch.tensor(pos)], scores[torch.tensor(neg)]


def dense_text_used(matcher, dense_captions: Sequence[str] | None) -> str:
    """What dense text :func:`score_triples` gives ``matcher`` with ``dense_captions``: ``"image-tied"``
    (each image's own dense caption), ``"none"`` (the matcher reads dense text but none was given: a
    SugarCrepe file's images have none, or the run has ``data.dense=false``; it is scored in its sparse
    mode) or
    ``"not read"`` (a matcher without dense text). A suite record keeps it (``"dense_text"``): its
    accuracies are of that mode."""
    if not matcher.consumes_dense:
        return "not read"
    return "none" if dense_captions is None else "image-tied"


def compositional_accuracy(
    model, tokenizer, images, triples: CompositionalTriples, **score_args
) -> dict[str, object]:
    """Accuracy per kind: the percentage of triples whose positive scores strictly higher (ties are wrong).

    Arguments as :func:`score_triples`.

    Returns:
        ``{kind: accuracy % or None (no triple), ..., "n": {kind: number of triples}}``, kinds in
        ``triples.kinds`` order; for the synthetic suite ``attribute_swap``, ``relation_swap``,
        ``object_replace``, ``count_change``.

    Raises:
        ValueError: a score is NaN or infinite (a broken model), naming the first triple.
    """
    pos, neg = score_triples(model, tokenizer, images, triples, **score_args)
    # NaN compares False: a broken model would read as 0% correct over the full count, a plausible number
    for name, scores in (("true caption", pos), ("negative", neg)):
        bad = ~torch.isfinite(scores)
        if bool(bad.any()):
            first = int(bad.nonzero()[0])
            raise ValueError(
                f"the model's {name} scores of {int(bad.sum())} of {len(scores)} triple(s) are not finite "
                f"(NaN or inf; first: triple {first}, kind {triples.kind[first]}): no accuracy can be "
                "computed"
            )
    return accuracy_by_kind(pos > neg, triples.kind, triples.kinds)


def accuracy_by_kind(correct: torch.Tensor | np.ndarray, kind: Sequence[str], kinds: Sequence[str]) -> dict:
    """``{kind: % correct or None, ..., "n": {kind: count}}`` from (M,) bool outcomes."""
    correct = np.asarray(correct, bool)
    labels = np.asarray(kind, dtype=object)
    result: dict[str, object] = {}
    counts: dict[str, int] = {}
    for k in kinds:
        hit = correct[labels == k] if len(labels) else correct[:0]
        counts[k] = int(hit.size)
        result[k] = 100.0 * float(hit.mean()) if hit.size else None
    result["n"] = counts
    return result


# -- sources of triples -----------------------------------------------------------------------------------


def synthetic_suite(dataset, split: str = "test", seed: int = 0):
    """The synthetic compositional suite of one split: ``(images, triples, dense_captions)``.

    Args:
        dataset: a :class:`~patchword.data.synthetic.SyntheticScenes`.
        split: which split's captions get hard negatives.
        seed: seed of :func:`~patchword.data.synthetic.hard_negatives`.
    Returns:
        an ``ArrayImages`` source of the split, the :class:`CompositionalTriples` of its hard negatives
        (the four kinds of ``NEGATIVE_KINDS``) and the split's dense captions.
    """
    from patchword.data.pipeline import ArrayImages
    from patchword.data.synthetic import NEGATIVE_KINDS, hard_negatives

    scene_split = dataset[split]
    negatives = hard_negatives(scene_split, dataset.config, seed=seed)
    triples = CompositionalTriples(
        negatives.image, negatives.positive, negatives.negative, negatives.kind, NEGATIVE_KINDS
    )
    return ArrayImages(scene_split.images), triples, list(scene_split.dense_captions)


def read_sugarcrepe(
    paths: str | Path | Sequence[str | Path], image_root: str | Path | None = None
) -> tuple[list[Path], CompositionalTriples]:
    """Read SugarCrepe-style JSON files into triples over image files.

    A file is either SugarCrepe's own format, ``{id: {"filename", "caption", "negative_caption"}}``, or a
    list of such records. The kind of a file's triples is its name without ``.json`` (SugarCrepe ships one
    file per kind: ``replace_att.json``, ``swap_obj.json``...).

    Args:
        paths: one file or several.
        image_root: directory the ``filename`` entries are relative to (default: each file's directory).
    Returns:
        the distinct image paths (an image source is ``FileImageSource(paths, run.image_transform())``)
        and the triples indexing them.
    Raises:
        MissingFileError: a JSON file or an image file does not exist.
        DataError: a file is not valid JSON of that shape (names the file and the record).
    """
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise ValueError("read_sugarcrepe needs at least one JSON file")
    image_paths: dict[Path, int] = {}
    image, positive, negative, kind, origin = [], [], [], [], []
    kinds = tuple(dict.fromkeys(Path(path).stem for path in paths))  # one kind a file name, in order
    for path in map(Path, paths):
        root, name = Path(image_root) if image_root is not None else path.parent, path.stem
        for record_id, record in _sugarcrepe_records(path):
            file = root / record["filename"]
            image.append(image_paths.setdefault(file, len(image_paths)))
            positive.append(record["caption"])
            negative.append(record["negative_caption"])
            kind.append(name)
            origin.append(f"{path}: record {record_id}")
    if missing := [p for p in image_paths if not p.is_file()]:  # a folder named as an image is no file
        first = f"{missing[0]}, {'a directory' if missing[0].is_dir() else 'which does not exist'}"
        raise MissingFileError(
            f"{len(missing)} of the {len(image_paths)} images named in {', '.join(map(str, paths))} are not "
            f"files (first: {first}); pass the directory holding them as image_root"
        )
    return list(image_paths), CompositionalTriples(np.array(image), positive, negative, kind, kinds, origin)


def _sugarcrepe_records(path: Path) -> list[tuple[str, Mapping]]:
    """The records of one file, validated, with their ids (keys, or positions in a list)."""
    require_file(path, "SugarCrepe file")
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))  # a byte order mark is skipped, as elsewhere
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not a JSON file ({err})") from err
    if isinstance(data, Mapping):
        records = [(str(k), v) for k, v in data.items()]
    elif isinstance(data, list):
        records = [(str(i), v) for i, v in enumerate(data)]
    else:
        raise DataError(
            f"{path}: expected an object of records or a list of records, got {type(data).__name__}"
        )
    if not records:
        raise DataError(f"{path}: no records")
    for record_id, record in records:
        if not isinstance(record, Mapping):
            raise DataError(f"{path}: record {record_id} is not an object")
        for key in ("filename", "caption", "negative_caption"):
            value = record.get(key)
            if not isinstance(value, str) or not value.strip():
                raise DataError(f"{path}: record {record_id} has no {key!r} string")
    return records


# -- reporting ----------------------------------------------------------------------------------------------


def _kinds_of(result: Mapping[str, object]) -> list[str]:
    return list(result["n"])  # the kinds in order (a result may carry other keys: its metadata)


#: What a suite record's ``"dense_text"`` (:func:`dense_text_used`) says, in words under its table.
DENSE_TEXT_WORDS = {
    "image-tied": "image-tied (each image's own dense caption)",
    "none": "none: the matcher reads dense text but none was given (suite files carry none, or the run "
    "has data.dense=false), so it was scored in its sparse mode",
    "not read": "not read by the matcher",
}


def format_compositional_table(result: Mapping[str, object]) -> str:
    """The result of :func:`compositional_accuracy` as a plain-text table (one row per kind); a suite
    record's dense text (``"dense_text"``) on a line under it."""
    table = format_compositional_comparison({"accuracy (%)": result})
    dense = result.get("dense_text")
    return table if dense is None else table + f"\ndense text: {DENSE_TEXT_WORDS.get(str(dense), dense)}"


def format_compositional_comparison(results: Mapping[str, Mapping[str, object]]) -> str:
    """Several models' results side by side: one row per kind, one accuracy column per model, then n."""
    names = list(results)
    first = results[names[0]]
    kinds = _kinds_of(first)
    width = max(len("kind"), *(len(k) for k in kinds))
    cols = [max(len(n), 6) for n in names]
    header = (
        "kind".ljust(width) + "".join(f"  {n:>{c}}" for n, c in zip(names, cols, strict=True)) + "       n"
    )
    lines = [header, "-" * len(header)]
    for k in kinds:
        cells = []
        for n, c in zip(names, cols, strict=True):
            acc = results[n].get(k)
            cells.append(f"  {'-' if acc is None else f'{acc:.1f}':>{c}}")
        lines.append(k.ljust(width) + "".join(cells) + f"  {first['n'][k]:>6d}")
    lines.append("(percentage of triples whose true caption scores strictly higher; chance 50, ties wrong)")
    return "\n".join(lines)
