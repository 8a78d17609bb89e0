"""Quality report of a dense-caption file: counts, empty and duplicate outputs, lengths, scene coverage.

Works on any SEPS-format JSONL (the released LLaVA files too: only ``text`` is required). Lengths are
given as percentiles of words (whitespace split), characters and BERT tokens. BERT tokens count what the
SEPS text encoder sees, ``[CLS]`` and ``[SEP]`` included; with a BERT vocabulary they are exact WordPiece
counts, without one they are BERT's basic tokens (words and punctuation before WordPiece), a lower bound.
The share of descriptions longer than 90 tokens is what official SEPS evaluation truncates. A file that
``patchword densify`` writes is said to be *partial* while it holds fewer lines than its sidecar's images
(a run interrupted, or one that skipped images).

For the synthetic scenes the report also says how many objects of each scene its description names. An
object is *named* when its colour word is followed by its shape word (singular or plural) with at most
three other words in between, none of them a colour or a joining word ("a small red circle" and "red
circles" name a red circle; "red and blue circles" names only a blue one). Identical objects (same colour
and shape) are named together. A named colour-shape pair that is not in the scene counts as *invented*.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from patchword.data.json_keys import unique_keys
from patchword.densify.shards import read_checked_sidecar
from patchword.errors import DataError
from patchword.readers import require_file

__all__ = [
    "StatsInput",
    "read_texts",
    "dense_stats",
    "scene_coverage",
    "mentioned_pairs",
    "scene_index",
    "format_stats",
    "PERCENTILES",
]

PERCENTILES = (5, 25, 50, 75, 95)
_WORD_RE = re.compile(r"[a-z]+")
_SYN_ID_RE = re.compile(r"syn-(train|dev|test)-(\d+)")
# Words that end a colour ... shape phrase ("a red and blue circle" names no red circle).
_BREAK_WORDS = frozenset({"and", "or", "with", "next", "near", "than", "beside", "between"})


@dataclass
class StatsInput:
    """The part of a dense-caption file the report reads.

    Attributes:
        texts: the descriptions, in file order.
        image_ids: ``metadata.image_id`` per line (None where a line has none, as in the SEPS release).
        model_ids: ``model_id`` per line ("" where absent).
        truncated: ``metadata.truncated`` per line (None where absent).
        torn_bytes: bytes after the last newline (an interrupted write).
        expected: images of the densify run that writes the file (its sidecar's range); None without a
            sidecar.
    """

    texts: list[str]
    image_ids: list[str | None]
    model_ids: list[str]
    truncated: list[bool | None]
    torn_bytes: int = 0
    expected: int | None = None


def _expected_images(path: Path) -> int | None:
    """Images of the densify run of ``path`` by its sidecar (the shard's range), None without one."""
    meta = read_checked_sidecar(path)  # a damaged range is named rather than reported as progress
    return None if meta is None else int(meta["stop"]) - int(meta["start"])


def read_texts(path: str | os.PathLike[str]) -> StatsInput:
    """Read a dense-caption JSONL for the report (only ``text`` is required on each line).

    Raises:
        MissingFileError: no such file (a ``FileNotFoundError``), or a directory.
        DataError: a line is not JSON, has no string ``text`` or a ``metadata`` that is not an object
            (names the line); a densify sidecar beside it is damaged.
    """
    path = Path(path)
    require_file(path, "dense caption file")
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    out = StatsInput([], [], [], [], torn_bytes=len(data) - end, expected=_expected_images(path))
    for lineno, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
        if not line.strip():
            raise DataError(f"{path}:{lineno}: blank line (expected one JSON object per image)")
        try:
            record = json.loads(line, object_pairs_hook=unique_keys(f"{path}:{lineno}"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise DataError(f"{path}:{lineno}: malformed JSON: {err}") from err
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise DataError(f"{path}:{lineno}: expected an object with a string field 'text'")
        meta = record.get("metadata")
        if meta is not None and not isinstance(meta, dict):  # its image id / truncated would go uncounted
            raise DataError(
                f"{path}:{lineno}: 'metadata' must be an object (image_id, truncated, ...), got "
                f"{type(meta).__name__}"
            )
        meta = meta or {}
        out.texts.append(record["text"])
        out.image_ids.append(None if meta.get("image_id") is None else str(meta["image_id"]))
        out.model_ids.append(str(record.get("model_id", "")))
        out.truncated.append(meta.get("truncated") if isinstance(meta.get("truncated"), bool) else None)
    return out


def _summary(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    arr = np.asarray(values, dtype=np.float64)
    out = {f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES}
    out.update(mean=float(arr.mean()), min=float(arr.min()), max=float(arr.max()))
    return out


def _basic_tokenizer():
    """BERT's basic tokenizer (lower-casing, punctuation split), which needs no vocabulary."""
    try:
        from transformers.models.bert.tokenization_bert_legacy import BasicTokenizer
    except ImportError:  # transformers 4.x
        from transformers.models.bert.tokenization_bert import BasicTokenizer
    return BasicTokenizer(do_lower_case=True)


def _bert_lengths(texts: Sequence[str], bert) -> tuple[list[int], bool]:
    """Per text: BERT tokens with [CLS]/[SEP] -> (lengths, exact). Without ``bert``: a lower bound."""
    if bert is not None:
        return [len(bert.tokenize(t)) + 2 for t in texts], True
    basic = _basic_tokenizer()
    return [len(basic.tokenize(t)) + 2 for t in texts], False


# --------------------------------------------------------------------------------------------------------
# Synthetic scenes
# --------------------------------------------------------------------------------------------------------


def scene_index(image_id: str | None, split: str) -> int:
    """The scene index of an image id: ``syn-<split>-<i>`` anywhere in it (e.g. an exported
    ``syn-test-000012.png``), or an id / file stem that is a plain number.

    Raises:
        DataError: the id names another split, or no index can be read from it.
    """
    if image_id is None:
        raise DataError("a line has no metadata.image_id, so it cannot be matched to a synthetic scene")
    match = _SYN_ID_RE.search(image_id)
    if match:
        if match.group(1) != split:
            raise DataError(
                f"image id {image_id!r} belongs to the synthetic {match.group(1)} split, not {split}"
            )
        return int(match.group(2))
    stem = Path(image_id).stem
    if stem.isdigit():
        return int(stem)
    raise DataError(
        f"image id {image_id!r} names no synthetic scene (expected syn-{split}-<index> or a number)"
    )


def _singular(word: str) -> str:
    """English plural -> singular, enough for shape nouns ("crosses" -> "cross", "circles" -> "circle")."""
    if word.endswith("sses"):
        return word[:-2]
    return word[:-1] if word.endswith("s") and not word.endswith("ss") else word


def mentioned_pairs(text: str, shapes: Sequence[str], colours: Sequence[str]) -> Counter[tuple[int, int]]:
    """The ``(colour index, shape index)`` pairs a text names, with how often (see the module docstring)."""
    shape_of = {s: i for i, s in enumerate(shapes)}
    colour_of = {c: i for i, c in enumerate(colours)}
    words = _WORD_RE.findall(text.lower())
    found: Counter[tuple[int, int]] = Counter()
    for k, word in enumerate(words):
        if word not in colour_of:
            continue
        for follower in words[k + 1 : k + 5]:
            if follower in colour_of or follower in _BREAK_WORDS:
                break
            shape = shape_of.get(_singular(follower))
            if shape is not None:
                found[(colour_of[word], shape)] += 1
                break
    return found


def scene_coverage(
    texts: Sequence[str], indices: Sequence[int], scenes, shapes: Sequence[str], colours: Sequence[str]
) -> dict[str, object]:
    """How many objects of its scene each description names.

    Args:
        texts: D descriptions.
        indices: (D,) scene index of each description.
        scenes: a :class:`~patchword.data.synthetic.SceneTable` (attribute codes index ``shapes`` /
            ``colours``).
        shapes, colours: the scene vocabularies (``SyntheticConfig.shapes`` / ``.colours``).

    Returns:
        ``objects`` and ``named`` (totals), ``named_share``, ``all_named_share`` (descriptions naming
        every object), ``named_per_description`` (mean), ``invented_per_description`` (mean count of
        named pairs absent from the scene), ``named_share_by_objects`` ({objects in scene: share named}),
        and ``per_description``: (named, objects) per description.
    """
    per_description = []
    invented = []
    by_count: dict[int, list[int]] = {}
    for text, index in zip(texts, indices, strict=True):
        if not 0 <= index < len(scenes):
            raise DataError(f"scene index {index} is outside the split ({len(scenes)} scenes)")
        objects = [(colour, shape) for _, shape, colour, _ in scenes.objects(index)]
        said = mentioned_pairs(text, shapes, colours)
        named = sum(1 for pair in objects if pair in said)
        per_description.append((named, len(objects)))
        invented.append(len(set(said) - set(objects)))
        by_count.setdefault(len(objects), [0, 0])
        by_count[len(objects)][0] += named
        by_count[len(objects)][1] += len(objects)
    total_named = sum(n for n, _ in per_description)
    total = sum(t for _, t in per_description)
    d = max(len(per_description), 1)
    return {
        "descriptions": len(per_description),
        "objects": total,
        "named": total_named,
        "named_share": total_named / max(total, 1),
        "all_named_share": sum(n == t for n, t in per_description) / d,
        "named_per_description": total_named / d,
        "invented_per_description": sum(invented) / d,
        "named_share_by_objects": {k: v[0] / v[1] for k, v in sorted(by_count.items())},
        "per_description": per_description,
    }


# --------------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------------


def dense_stats(
    data: StatsInput,
    *,
    bert=None,
    token_limits: Sequence[int] = (90, 128),
    synthetic: tuple[str, object] | None = None,
) -> dict[str, object]:
    """The report of one file.

    Args:
        data: from :func:`read_texts`.
        bert: a :class:`~patchword.encoders.BertCaptionTokenizer` for exact BERT token counts (None:
            basic-token lower bound).
        token_limits: report the share of descriptions longer than each of these BERT token counts.
        synthetic: ``(split, SyntheticConfig)`` to add the scene coverage of the synthetic scenes.

    Returns:
        a JSON-ready dict: ``count``, ``empty``, ``duplicate_lines`` (lines repeating an earlier non-empty
        text), ``duplicated_texts`` (distinct texts seen more than once), ``duplicate_image_ids`` (None
        when the lines carry no ids) among the ``image_ids_recorded`` lines that carry one, ``truncated``
        (None when the file does not say) among the ``truncated_recorded`` lines that say, ``model_ids``,
        ``words`` / ``chars`` / ``bert_tokens`` percentiles, ``bert_tokens_exact``, ``over_limit``,
        ``partial`` (``{"done": lines, "expected": images}`` while a densify run's file lacks images, else
        None) and, for synthetic data, ``scenes``.
    """
    texts = data.texts
    non_empty = [t for t in texts if t.strip()]
    counts = Counter(non_empty)
    ids = [i for i in data.image_ids if i is not None]
    bert_lengths, exact = _bert_lengths(texts, bert)
    truncated = [t for t in data.truncated if t is not None]
    report: dict[str, object] = {
        "count": len(texts),
        "empty": len(texts) - len(non_empty),
        "duplicate_lines": sum(c - 1 for c in counts.values() if c > 1),
        "duplicated_texts": sum(1 for c in counts.values() if c > 1),
        "duplicate_image_ids": len(ids) - len(set(ids)) if ids else None,
        "image_ids_recorded": len(ids),  # the lines the count above covers
        "truncated": sum(truncated) if truncated else None,
        "truncated_recorded": len(truncated),
        "torn_bytes": data.torn_bytes,
        "model_ids": dict(Counter(data.model_ids).most_common()),
        "words": _summary([len(t.split()) for t in texts]),
        "chars": _summary([len(t) for t in texts]),
        "bert_tokens": _summary(bert_lengths),
        "bert_tokens_exact": exact,
        "over_limit": {str(k): sum(n > k for n in bert_lengths) / max(len(texts), 1) for k in token_limits},
        "partial": (
            {"done": len(texts), "expected": data.expected}
            if data.expected is not None and len(texts) < data.expected
            else None
        ),
    }
    if synthetic is not None:
        split, config = synthetic
        from patchword.data.synthetic import generate_split

        scenes = generate_split(config, split).scenes
        indices = [scene_index(i, split) for i in data.image_ids]
        coverage = scene_coverage(texts, indices, scenes, config.shapes, config.colours)
        coverage.pop("per_description")
        report["scenes"] = {"split": split, **coverage}
    return report


def _row(name: str, summary: dict[str, float]) -> str:
    if not summary:
        return f"  {name:<12} -"
    cells = "  ".join(f"p{p} {summary[f'p{p}']:.0f}" for p in PERCENTILES)
    return f"  {name:<12} {cells}  mean {summary['mean']:.1f}  max {summary['max']:.0f}"


def _of_recorded(count: object, recorded: object) -> str:
    """``"n/a"`` when no line records the field, else ``"N of M lines that record it"``."""
    if count is None:
        return "n/a"
    return f"{count} of {recorded} lines that record it" if recorded is not None else str(count)


def format_stats(path: str, report: dict[str, object]) -> str:
    """The report as the text ``patchword densify stats`` prints."""
    count = report["count"]
    lines = [f"{path}: {count} descriptions"]
    partial = report.get("partial")
    if partial:
        lines.append(
            f"  partial: {partial['done']} of {partial['expected']} images (rerun densify to finish)"
        )
    models = ", ".join(f"{k or '(none)'} x{v}" for k, v in report["model_ids"].items())
    lines.append(f"  models       {models}")
    # each count covers only the lines that record its field: "N of M lines that record it"
    dup_ids = _of_recorded(report["duplicate_image_ids"], report.get("image_ids_recorded"))
    truncated = _of_recorded(report["truncated"], report.get("truncated_recorded"))
    lines.append(
        f"  empty {report['empty']}, duplicate lines {report['duplicate_lines']} "
        f"({report['duplicated_texts']} distinct texts repeated), duplicate image ids {dup_ids}, "
        f"stopped by max-new-tokens {truncated}"
    )
    if report["torn_bytes"]:
        lines.append(f"  torn last line: {report['torn_bytes']} bytes (an interrupted write; rerun densify)")
    lines.append(_row("words", report["words"]))
    lines.append(_row("characters", report["chars"]))
    lines.append(_row("BERT tokens" if report["bert_tokens_exact"] else "BERT tok >=", report["bert_tokens"]))
    over = ", ".join(f"> {k}: {v:.1%}" for k, v in report["over_limit"].items())
    bound = (
        "" if report["bert_tokens_exact"] else " (at least; basic tokens, pass --bert-vocab for exact counts)"
    )
    lines.append(f"  longer than  {over}{bound}")
    scenes = report.get("scenes")
    if scenes:
        by = ", ".join(f"{k}: {v:.0%}" for k, v in scenes["named_share_by_objects"].items())
        lines.append(
            f"  scenes ({scenes['split']}): named {scenes['named']} of {scenes['objects']} objects "
            f"({scenes['named_share']:.1%}); every object named in {scenes['all_named_share']:.1%} of "
            f"descriptions; {scenes['invented_per_description']:.2f} invented colour-shape pairs each"
        )
        lines.append(f"  named share by objects in scene: {by}")
    return "\n".join(lines)
