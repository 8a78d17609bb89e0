"""The published results of the methods patchword imports, to show beside the numbers measured here.

``published_results.json`` (package data beside this module) holds the retrieval results the SEPS, LAPS,
SCAN and NAAF papers and official READMEs print, as the project's reference notes collected them: one row
per method, backbone, dataset (``f30k``: Flickr30K 1K test; ``coco1k``: MS-COCO 1K, five folds of the 5K
test averaged; ``coco5k``: MS-COCO 5K) and variant (an ensemble, an ablation, a README's reproduction), with
its protocol, whether that protocol is leaky (official SEPS scores each caption with the dense caption of its
ground-truth image), its source and a note. Numbers are kept as printed, never corrected: a published rSum
that is not the sum of the six printed recalls, a T2I R@1 above I2T R@1, a README row that repeats another
stay visible, described in the row's ``note``. A recall the source does not print is ``None`` (the CLIP and
ablation rows and the LAPS README print R@1 and R@5 only). TGDT and UCMFH have no rows: their papers' tables
were not available to the notes.

Families and backbones are spelled as ``patchword import`` records a checkpoint: ``family`` as in
``import.json``, the backbone as :func:`imported_model` derives it from the checkpoint's ``opt``. A SCAN
checkpoint is one of four variants (``opt.cross_attn`` x ``opt.agg_func``: ``t-i LSE``, ``t-i AVG``, ``i-t
LSE``, ``i-t AVG``): only the rows of its variant, and the ensembles it is one member of, are its
published results. :func:`caveats` says why a comparison is not like for like: another image count,
protocol (leaky or not), split, dataset, an ensemble's row beside one model, another SCAN lambda, SEPS /
LAPS texts cut to ``opt.max_word`` tokens before BERT (the official code cuts BERT's output). Everything
here is pure, for ``patchword report`` and the export card: the only file read is the shipped table.

Over 400 lines: the table's rows, the checkpoint facts they are matched by (backbone, variant, dataset,
split) and every reason a comparison is not like for like are read together; one module keeps them in step.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import PurePath
from typing import Any

from patchword.data.karpathy import karpathy_split_name
from patchword.eval.known_splits import KNOWN_SPLITS
from patchword.eval.metrics import RECALL_KEYS

__all__ = [
    "DATASETS",
    "METRIC_KEYS",
    "TEST_IMAGES",
    "SELECTION_SPLIT",
    "TEST_SPLITS",
    "TRAINING_SPLIT",
    "ImportedModel",
    "PublishedResult",
    "caveats",
    "compare_rows",
    "evaluated_role",
    "imported_model",
    "measured_metrics",
    "not_measured",
    "published_results",
    "scan_variant",
    "scored_split",
    "split_use",
]

#: the shipped table, beside this module
TABLE = "published_results.json"

#: the six recalls (percent) and their sum, under patchword's metric names (``i2t_r1`` ... ``rsum``)
METRIC_KEYS = RECALL_KEYS
_SIX = tuple(key for key in METRIC_KEYS if key != "rsum")

#: dataset key -> how the papers name the protocol
DATASETS = {"f30k": "Flickr30K 1K", "coco1k": "MS-COCO 1K", "coco5k": "MS-COCO 5K"}

#: images of the test split each published protocol evaluates (COCO 1K: the 5K split, in five folds)
TEST_IMAGES = {"f30k": 1000, "coco1k": 5000, "coco5k": 5000}

#: the split each published protocol evaluates, as the imported runs name it (``data.test_split``):
#: Flickr30K's 1K ``test``; MS-COCO's 5K ``testall`` (COCO 1K: its five folds). COCO's own ``test`` split
#: is a single 1K set, and a ``dev`` split is never a published test result (reference/naaf_scan_vse.md 3.5)
TEST_SPLITS = {"f30k": "test", "coco1k": "testall", "coco5k": "testall"}

#: published dataset -> the data it was measured on; and how a caveat names that data
_DATA_OF = {"f30k": "f30k", "coco1k": "coco", "coco5k": "coco"}
_DATA_NAMES = {"f30k": "Flickr30K", "coco": "MS-COCO", "f8k": "Flickr8K", "synthetic": "synthetic"}

#: words in a ``data.root`` path component that name a dataset (Flickr8K before the Flickr catch-all)
_ROOT_WORDS = (("coco", ("coco",)), ("f8k", ("f8k", "flickr8k")), ("f30k", ("f30k", "flickr")))

#: SCAN's ``opt.cross_attn`` and ``opt.agg_func`` -> how the published rows name a variant (``t-i AVG``)
_SCAN_DIRECTIONS = {"t2i": "t-i", "i2t": "i-t"}
_SCAN_AGGREGATIONS = {"LogSumExp": "LSE", "Mean": "AVG", "Max": "MAX", "Sum": "SUM"}

#: ``opt.dataset`` (SEPS / LAPS) or ``opt.data_name`` (SCAN / NAAF) -> the datasets its evaluation reports
_OPT_DATASETS = {
    "f30k": ("f30k",),
    "coco": ("coco1k", "coco5k"),
    "f30k_precomp": ("f30k",),
    "coco_precomp": ("coco1k", "coco5k"),
}

#: NAAF's ``opt.precomp_enc_text_type`` -> backbone (bottom-up regions; Bi-GRU over random or GloVe words)
_NAAF_TEXT = {"basic": "butd-regions+bigru", "GloVe": "butd-regions+glove-bigru"}


@dataclass(frozen=True)
class PublishedResult:
    """One published result, as printed (recalls and rSum in percent; ``None``: not printed by the source).

    Attributes:
        family: the method, as ``import.json`` spells it (``seps``, ``laps``, ``scan``, ``naaf``).
        backbone: as :func:`imported_model` derives it (``vit-b-224``, ``swin-b-384``, ``clip-vit-b``,
            ``butd-regions+bigru``, ``butd-regions+glove-bigru``); ``None`` where the source does not say.
        dataset: ``f30k``, ``coco1k`` or ``coco5k``.
        variant: ``""`` for the method as its paper's main table reports it; otherwise what differs (an
            ensemble, an ablation, a README's reproduction, a CLIP backbone, a SCAN direction).
        protocol: the evaluation protocol in words.
        leaky: whether the published protocol lets a query carry text generated from its target image.
        source: where the numbers are printed (paper table or README).
        note: what is odd about the row as published, or ``""``.
    """

    family: str
    backbone: str | None
    dataset: str
    variant: str
    protocol: str
    leaky: bool
    i2t_r1: float | None
    i2t_r5: float | None
    i2t_r10: float | None
    t2i_r1: float | None
    t2i_r5: float | None
    t2i_r10: float | None
    rsum: float | None
    source: str
    note: str

    def metrics(self) -> dict[str, float | None]:
        """The six recalls and rSum under patchword's metric names (``i2t_r1`` ... ``rsum``)."""
        return {key: getattr(self, key) for key in METRIC_KEYS}

    def recall_sum(self) -> float | None:
        """The sum of the six printed recalls (to one decimal, as they are printed); ``None`` when the
        source does not print all six."""
        values = [getattr(self, key) for key in _SIX]
        return None if None in values else round(sum(values), 1)

    def rsum_gap(self) -> float | None:
        """Published rSum minus the sum of the six printed recalls (0.0 when they agree); ``None`` when
        either is not printed. A nonzero gap is described in ``note``, never corrected."""
        total = self.recall_sum()
        return None if total is None or self.rsum is None else round(self.rsum - total, 1)


@dataclass(frozen=True)
class ImportedModel:
    """What an imported checkpoint's ``import.json`` says to look up in the table.

    Attributes:
        family: ``import.json``'s ``family``.
        backbone: the backbone the official code trains for the checkpoint's ``opt`` (``None``: unknown).
        datasets: the published datasets its ``opt`` names (COCO: ``coco1k`` and ``coco5k``).
        basis: the ``opt`` values both were read from, in words (for a model card).
        variant: SCAN only: ``t-i LSE``, ``t-i AVG``, ``i-t LSE`` or ``i-t AVG`` (:func:`scan_variant`);
            ``None`` for the other families, or a SCAN opt naming none of them.
        opt: the official ``opt`` as recorded (a caveat compares the hyperparameters a row names).
    """

    family: str
    backbone: str | None
    datasets: tuple[str, ...]
    basis: str
    variant: str | None = None
    opt: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def published(self) -> list[PublishedResult]:
        """The table's rows for this checkpoint: its family and backbone on each of its datasets; none
        when the backbone is unknown (``published_results`` would take None for "any backbone"). For SCAN,
        only the rows of its variant and the ensembles it is a member of: a t-i LSE model's "difference"
        from an i-t AVG row measures the variant, not the import (none when its variant is unknown)."""
        if self.backbone is None:
            return []
        rows = [row for d in self.datasets for row in published_results(self.family, self.backbone, d)]
        if self.family == "scan":
            rows = [row for row in rows if self.variant is not None and self.variant in _scan_members(row)]
        return rows


def _number(value: Any, where: str) -> float | None:
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return None if value is None else float(value)
    raise ValueError(f"{TABLE}: {where} is {value!r}, not a number")


def _row(raw: Mapping[str, Any], index: int) -> PublishedResult:
    where = f"row {index}"
    i2t, t2i = raw.get("i2t"), raw.get("t2i")
    if not (isinstance(i2t, list) and isinstance(t2i, list) and len(i2t) == len(t2i) == 3):
        raise ValueError(f"{TABLE}: {where} needs i2t and t2i as [R@1, R@5, R@10]")
    if raw.get("dataset") not in DATASETS:
        raise ValueError(
            f"{TABLE}: {where} has dataset {raw.get('dataset')!r}, not one of {', '.join(DATASETS)}"
        )
    recalls = [_number(v, f"{where} {key}") for key, v in zip(_SIX, [*i2t, *t2i], strict=True)]
    return PublishedResult(
        family=str(raw["family"]),
        backbone=None if raw.get("backbone") is None else str(raw["backbone"]),
        dataset=str(raw["dataset"]),
        variant=str(raw.get("variant", "")),
        protocol=str(raw["protocol"]),
        leaky=bool(raw["leaky"]),
        **dict(zip(_SIX, recalls, strict=True)),
        rsum=_number(raw.get("rsum"), f"{where} rsum"),
        source=str(raw["source"]),
        note=str(raw.get("note", "")),
    )


@lru_cache(maxsize=1)
def _table() -> tuple[PublishedResult, ...]:
    """Every row of the shipped table (read once)."""
    text = resources.files(__package__).joinpath(TABLE).read_text(encoding="utf-8")
    return tuple(_row(raw, i) for i, raw in enumerate(json.loads(text)["rows"]))


def published_results(
    family: str | None = None, backbone: str | None = None, dataset: str | None = None
) -> list[PublishedResult]:
    """The published results of ``family`` with ``backbone`` on ``dataset`` (``None``: any), in the
    table's order (by family, then source, backbone and dataset). A family or backbone without rows gives
    ``[]`` (TGDT and UCMFH have none).

    Raises:
        ValueError: ``dataset`` is not ``f30k``, ``coco1k`` or ``coco5k``.
    """
    if dataset is not None and dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; the published ones: {', '.join(DATASETS)}")
    return [
        row
        for row in _table()
        if (family is None or row.family == family)
        and (backbone is None or row.backbone == backbone)
        and (dataset is None or row.dataset == dataset)
    ]


def measured_metrics(metrics: Mapping[str, Any] | None, dataset: str) -> dict[str, float]:
    """The recalls and rSum a recorded patchword evaluation (``eval_*.json`` / ``summary.json``) gives for
    the published ``dataset``: ``coco1k`` reads the ``coco1k_*`` fold averages (``eval.coco_1k``), the others
    the split's own keys. Only the keys present; ``{}`` when none is."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; the published ones: {', '.join(DATASETS)}")
    prefix = "coco1k_" if dataset == "coco1k" else ""
    found = {key: (metrics or {}).get(prefix + key) for key in METRIC_KEYS}
    return {key: float(value) for key, value in found.items() if isinstance(value, (int, float))}


def compare_rows(published: PublishedResult, measured: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Three rows, each ``{"row": name, "i2t_r1": ..., ..., "rsum": ...}``: ``"published"`` (as printed),
    ``"measured here"`` (``measured``'s values under the same keys, e.g. from :func:`measured_metrics`) and
    ``"difference"`` (measured here minus published). A value is ``None`` where its side is missing: not
    printed by the source, not measured here (``measured`` empty or ``None``: not measured here yet)."""
    printed = published.metrics()
    here: dict[str, float | None] = {}
    for key in METRIC_KEYS:
        value = (measured or {}).get(key)
        here[key] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    difference = {
        key: None if printed[key] is None or here[key] is None else round(here[key] - printed[key], 10)
        for key in METRIC_KEYS
    }
    return [
        {"row": "published", **printed},
        {"row": "measured here", **here},
        {"row": "difference", **difference},
    ]


def not_measured(
    record: Mapping[str, Any] | None, measured: Mapping[str, Any], dataset: str, coco_1k: bool
) -> str:
    """What a published row's "measured here" row says where nothing measured it (``""`` where something
    did): no evaluation yet (``record`` empty), or an evaluation without the figures of its protocol
    (``measured``: :func:`measured_metrics` of ``record``; the COCO 1K fold averages, ``coco1k_*``, exist
    only with ``eval.coco_1k``, the run's ``coco_1k``). ``patchword report`` and the export card alike."""
    if not record:
        return "not measured here yet"
    if measured:
        return ""
    if dataset == "coco1k" and not coco_1k:
        return "not measured: eval.coco_1k was not set"
    return f"not measured: the evaluation records no {DATASETS[dataset]} figures"


def _field(data: Any, key: str) -> Any:
    """``data.key`` of a ``DataConfig``, or ``data[key]`` of its dict form."""
    return data.get(key) if isinstance(data, Mapping) else getattr(data, key, None)


def _root_dataset(root: str) -> str | None:
    """The dataset a ``data.root`` path names (``f30k``, ``coco``, ``f8k``), read from its last component
    that names exactly one; ``None`` when none does (a layout patchword cannot recognise)."""
    for part in reversed(PurePath(root).parts):
        low = part.lower()
        named = {name for name, words in _ROOT_WORDS if any(w in low for w in words)}
        if "f8k" in named:  # "flickr8k" also holds the catch-all "flickr"
            named.discard("f30k")
        if len(named) == 1:
            return named.pop()
    return None


#: What a scored split is to the run besides a test set (:func:`split_use`): the split its checkpoint was
#: chosen on, or the one it trained on. Neither is a held-out test result.
SELECTION_SPLIT = "model selection"
TRAINING_SPLIT = "training"


def evaluated_role(record: Mapping[str, Any] | None, data: Any = None) -> str | None:
    """The role (``test`` / ``dev``) a recorded evaluation scored: ``patchword eval`` and training record
    it as ``"split"`` (``runs/evaluate.py``); a record naming the dataset's split instead is matched
    against ``data``'s ``test_split`` / ``dev_split``. ``None``: no record, or a split ``data`` does not
    name."""
    if not record:
        return None
    role, split = record.get("role"), record.get("split")
    if role in ("test", "dev"):
        return role
    if split in ("test", "dev"):
        return split
    if isinstance(split, str) and data is not None:
        for role in ("test", "dev"):
            if split == _field(data, f"{role}_split"):
                return role
    return None


def scored_split(record: Mapping[str, Any] | None, data: Any = None) -> str | None:
    """The split of the dataset a recorded evaluation read, as the run names it: its role through ``data``
    (the run's data config, a ``DataConfig`` or its dict): the ``test`` role reads ``data.test_split``, the
    ``dev`` role ``data.dev_split`` or, with ``data.dev_from_train``, images held out of
    ``data.train_split`` (``"train hold-out"``). A record naming a split itself is taken at its word, and
    so is the ``"data_split"`` an evaluation records beside its role (``runs/evaluate.py``: the split it
    read, whatever the config says now). Without either or ``data`` a ``test`` role cannot be named
    (``None``); ``dev`` is ``"dev"``."""
    recorded = record.get("data_split") if record else None
    if isinstance(recorded, str):
        return recorded
    split = record.get("split") if record else None
    if not isinstance(split, str):
        return None
    if split not in ("test", "dev"):
        return split
    if data is None:
        return "dev" if split == "dev" else None
    if split == "dev" and _field(data, "dev_from_train"):
        return f"{_field(data, 'train_split')} hold-out"
    name = _field(data, f"{split}_split")
    return name if isinstance(name, str) else None


def split_use(record: Mapping[str, Any] | None, data: Any = None) -> str | None:
    """What the scored split is to the run besides a test set: :data:`SELECTION_SPLIT` for the ``dev`` role
    (training chose its checkpoint on it) and for a ``test`` role reading ``data.dev_split`` (a run with
    ``data.test_split=dev``, unless the dev split is held out of training: ``data.dev_from_train``),
    :data:`TRAINING_SPLIT` for a ``test`` role reading ``data.train_split``; ``None`` for a held-out split,
    or when nothing says. A record's own ``"split_use"`` (written with its ``"data_split"`` by
    ``runs/evaluate.py``) is taken at its word."""
    if record and "split_use" in record and record["split_use"] in (None, SELECTION_SPLIT, TRAINING_SPLIT):
        return record["split_use"]
    role = evaluated_role(record, data)
    if role == "dev":
        return SELECTION_SPLIT
    if role != "test" or data is None:
        return None
    name = _same_name(data, scored_split(record, data))
    if name == _same_name(data, _field(data, "train_split")):
        return TRAINING_SPLIT
    if name == _same_name(data, _field(data, "dev_split")) and not _field(data, "dev_from_train"):
        return SELECTION_SPLIT
    return None


def _same_name(data: Any, name: Any) -> Any:
    """``name`` as the dataset's reader takes it: a Karpathy json calls the dev split ``val`` (its reader
    reads ``dev`` as ``val``), so ``data.test_split=val`` beside ``data.dev_split=dev`` reads the dev
    split."""
    if _field(data, "dataset") == "karpathy" and isinstance(name, str):
        return karpathy_split_name(name)
    return name


def _split_caveat(published: PublishedResult, record: Mapping[str, Any], data: Any) -> list[str]:
    """The measured split, as the run names it (:func:`scored_split`), against the published protocol's test
    split. Without ``data`` a ``test`` role cannot be named, and is taken on trust."""
    name = scored_split(record, data)
    expected = TEST_SPLITS[published.dataset]
    if name is None or name == expected:
        return []
    return [
        f"measured on split `{name}`, the published {DATASETS[published.dataset]} protocol on split "
        f"`{expected}` (its test split): not a like-for-like comparison"
    ]


def _known_captions(record: Mapping[str, Any]) -> tuple[bool, dict[str, Any] | None]:
    """``(recorded, match)``: whether ``record`` says which known test split its captions are
    (:func:`~patchword.eval.known_splits.identify_captions`, recorded since evaluations record it), and the
    match (None: none of them is a known split's). A damaged field counts as not recorded."""
    if "known_captions" not in record:
        return False, None
    match = record["known_captions"]
    if match is None:
        return True, None
    counts = [match.get(key) for key in ("found", "captions")] if isinstance(match, Mapping) else []
    if (
        len(counts) != 2
        or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)
        or counts[0] > counts[1]
        or match.get("split") not in KNOWN_SPLITS
    ):
        return False, None
    return True, dict(match)


def _dataset_caveat(published: PublishedResult, data: Any, record: Mapping[str, Any]) -> list[str]:
    """The data the run measured against the dataset of the published row: by the captions' own text when
    the record says which known test split they are (:func:`_known_captions`), else (an evaluation recorded
    before that) by the reader and the name of ``data.root``, the only other thing that says which dataset
    lies there."""
    wanted, protocol = _DATA_OF[published.dataset], DATASETS[published.dataset]
    reader = _field(data, "dataset") if data is not None else None
    if isinstance(reader, str) and reader.startswith("synthetic"):
        return [
            f"measured on synthetic data (data.dataset `{reader}`), the published {protocol} row on "
            f"{_DATA_NAMES[wanted]}: not a like-for-like comparison"
        ]
    recorded, match = _known_captions(record)
    if recorded:
        return _caption_caveat(published, record, match)
    if data is None:
        return []
    root = _field(data, "root")
    found = _root_dataset(str(root)) if root else None
    if found is None:
        return [
            f"data.root `{root}` names neither Flickr30K nor MS-COCO: patchword cannot check that the data "
            f"measured here is the published {protocol} row's ({_DATA_NAMES[wanted]})"
        ]
    if found != wanted:
        return [
            f"measured on {_DATA_NAMES[found]} data (data.root `{root}`), the published {protocol} row on "
            f"{_DATA_NAMES[wanted]} (the dataset the checkpoint's opt names): not a like-for-like comparison"
        ]
    return []


#: The share of the measured captions a known split must hold for the data to be taken as that split's:
#: copies of one split differ by a few corrected captions (SCAN's COCO ``test_caps.txt``, the first 1K fold,
#: has "cegetables" where its ``testall_caps.txt`` has "VEGETABLES": 4999 of 5000).
KNOWN_SHARE = 0.99


def _caption_caveat(
    published: PublishedResult, record: Mapping[str, Any], match: dict[str, Any] | None
) -> list[str]:
    """The caveat of a recorded caption match (``match`` None: no caption is a known split's)."""
    wanted, protocol = _DATA_OF[published.dataset], DATASETS[published.dataset]
    if match is None:
        captions = record.get("captions")
        some = f"none of the {captions} captions" if isinstance(captions, int) else "no caption"
        return [
            f"{some} measured is a caption of a published test split (known by their text: "
            f"{', '.join(split.label for split in KNOWN_SPLITS.values())}), the published {protocol} row on "
            f"{_DATA_NAMES[wanted]}'s: not a like-for-like comparison"
        ]
    split = KNOWN_SPLITS[match["split"]]
    found, captions = match["found"], match["captions"]
    if split.dataset != wanted:
        return [
            f"measured on {split.label} captions ({found} of {captions} are its, by their text), the "
            f"published {protocol} row on {_DATA_NAMES[wanted]}: not a like-for-like comparison"
        ]
    if found < KNOWN_SHARE * captions:
        return [
            f"{captions - found} of the {captions} captions measured are not {split.label} captions (by "
            f"their text): not exactly the published {protocol} row's data"
        ]
    return []


def _variant_caveats(
    published: PublishedResult, record: Mapping[str, Any], model: ImportedModel | None
) -> list[str]:
    """An ensemble's row beside one model; a SCAN row of another variant or another softmax lambda."""
    found = []
    if published.variant.startswith("ensemble"):
        which = published.variant.removeprefix("ensemble").lstrip(":").strip()
        members = record.get("ensemble")  # an ensemble evaluation records its members
        here = f"{len(members)} models" if isinstance(members, list) and len(members) > 1 else "one model"
        found.append(  # no semicolon: the report joins its caveats with them
            f"published for a two-model ensemble ({f'{which}: ' if which else ''}two models' similarities "
            f"averaged), measured here: {here}: not a like-for-like comparison"
        )
    if model is None or model.family != "scan" or published.family != "scan":
        return found
    if model.variant not in _scan_members(published):
        found.append(
            f"published for another SCAN variant ({published.variant}); this checkpoint is SCAN "
            f"{model.variant or 'of a variant its opt does not name'}: not a like-for-like comparison"
        )
    printed = re.search(r"lambda1=([0-9.]+)", published.variant)
    trained = model.opt.get("lambda_softmax")
    number = isinstance(trained, (int, float)) and not isinstance(trained, bool)
    if printed and number and float(trained) != float(printed.group(1)):
        found.append(
            f"published with lambda1={printed.group(1)} (opt.lambda_softmax), this checkpoint trained with "
            f"{trained:g}: not a like-for-like comparison"
        )
    return found


#: ``opt.max_word`` of the official SEPS / LAPS ``arguments.py`` when a checkpoint's opt lacks it
OFFICIAL_MAX_WORD = 90


def text_length_caveat(family: str, cut: int, kept: int) -> str:
    """SEPS / LAPS (``family``): patchword cuts each text to ``cut`` BERT tokens before BERT
    (``data.max_caption_len``), the official evaluation runs BERT on the whole text and keeps its first
    ``kept`` (``opt.max_word``) embeddings (docs/models.md, "SEPS max_word"). They agree on shorter texts
    only: most SEPS dense captions are longer, captions rarely are. One sentence, no semicolon (a report
    joins its caveats with them); the import warns with it, the card and the report repeat it."""
    longer = (
        "every longer text (most SEPS dense captions, few captions)"
        if family == "seps"
        else "every longer caption (few are)"
    )
    return (
        f"patchword cuts each text to {cut} BERT tokens before BERT (data.max_caption_len), the official "
        f"evaluation runs BERT on the whole text and keeps its first {kept} embeddings (opt.max_word): the "
        f"scores differ on {longer}, so recalls measured with patchword are not the official code's exactly"
    )


def _text_length_caveats(model: ImportedModel | None, data: Any) -> list[str]:
    """:func:`text_length_caveat` of an imported SEPS / LAPS model measured on ``data`` (none otherwise)."""
    if model is None or model.family not in ("seps", "laps"):
        return []
    kept = model.opt.get("max_word", OFFICIAL_MAX_WORD)
    kept = kept if isinstance(kept, int) and not isinstance(kept, bool) else OFFICIAL_MAX_WORD
    cut = _field(data, "max_caption_len") if data is not None else None
    cut = cut if isinstance(cut, int) and not isinstance(cut, bool) else kept
    return [text_length_caveat(model.family, cut, kept)]


def caveats(
    published: PublishedResult,
    record: Mapping[str, Any] | None,
    data: Any = None,
    model: ImportedModel | None = None,
) -> list[str]:
    """Why a recorded evaluation (``eval_*.json`` / ``summary.json``) is not a like-for-like comparison with
    ``published``: another number of test images, another protocol (leaky or not), another split than the
    published protocol's test split, other data than the row's dataset, an ensemble's row beside one model,
    and (``model``: the imported checkpoint) a SCAN row of another variant or lambda, a SEPS / LAPS
    checkpoint's texts cut before BERT where the official code cuts BERT's output. ``data``: the data
    config the evaluation ran with (a ``DataConfig`` or its dict; the run's ``config.yaml``, which a
    recorded evaluation matches), without which split names and the dataset go unchecked. ``[]`` when
    nothing recorded says so (or nothing is recorded)."""
    if not record:
        return []
    found = []
    images = record.get("images")
    expected = TEST_IMAGES[published.dataset]
    if isinstance(images, int) and images != expected:
        found.append(
            f"measured on {images} test images, the published {DATASETS[published.dataset]} protocol on "
            f"{expected}: not a like-for-like comparison"
        )
    here = bool(record.get("leaky"))
    if here != published.leaky:
        found.append(
            f"published with a {'LEAKY' if published.leaky else 'leak-free'} protocol, measured here "
            f"{'LEAKY' if here else 'leak-free'}"
        )
    found += _split_caveat(published, record, data)
    found += _dataset_caveat(published, data, record)
    found += _variant_caveats(published, record, model)
    found += _text_length_caveats(model, data)
    return found


def scan_variant(opt: Mapping[str, Any]) -> str | None:
    """The SCAN variant of an official ``opt`` as the published rows name it: ``opt.cross_attn`` (``t2i``:
    ``t-i``, ``i2t``: ``i-t``) and ``opt.agg_func`` (``LogSumExp``: ``LSE``, ``Mean``: ``AVG``...), e.g.
    ``t-i LSE``; ``None`` when either is not an official value."""
    direction, aggregation = opt.get("cross_attn"), opt.get("agg_func")
    if not isinstance(direction, str) or not isinstance(aggregation, str):
        return None
    if direction not in _SCAN_DIRECTIONS or aggregation not in _SCAN_AGGREGATIONS:
        return None
    return f"{_SCAN_DIRECTIONS[direction]} {_SCAN_AGGREGATIONS[aggregation]}"


def _scan_members(row: PublishedResult) -> set[str]:
    """The SCAN variants a row was measured with: ``t-i AVG (lambda1=9)`` -> {t-i AVG}; an ensemble's
    ``ensemble: t-i AVG + i-t LSE`` -> both."""
    text = row.variant.removeprefix("ensemble:").strip()
    return {re.sub(r"\s*\(.*\)$", "", member).strip() for member in text.split(" + ") if member.strip()}


def _said(opt: Mapping[str, Any], key: str) -> str:
    """``opt.key `value``` for a model card's basis; ``opt.key absent`` when the opt has no such field (a
    card never prints ``None`` for a value nobody recorded)."""
    return f"opt.{key} `{opt[key]}`" if key in opt else f"opt.{key} absent"


def _vision_backbone(family: str, opt: Mapping[str, Any]) -> tuple[str | None, str]:
    """SEPS / LAPS: the backbone the official code loads for ``opt.vit_type`` (``vit`` / ``swin``, with a
    ``_224`` / ``_384`` suffix that only SEPS reads: LAPS builds 224-pixel backbones whatever it says)."""
    vit_type = opt.get("vit_type")
    if not isinstance(vit_type, str) or vit_type.split("_")[0] not in ("vit", "swin"):
        return None, _said(opt, "vit_type")
    size = "384" if family == "seps" and vit_type.endswith("_384") else "224"
    return f"{vit_type.split('_')[0]}-b-{size}", f"opt.vit_type `{vit_type}`"


def _region_backbone(family: str, opt: Mapping[str, Any]) -> tuple[str | None, str]:
    """SCAN / NAAF: bottom-up regions and a (bidirectional) GRU over random or GloVe word embeddings."""
    if family == "naaf":
        text = opt.get("precomp_enc_text_type")
        return _NAAF_TEXT.get(text) if isinstance(text, str) else None, _said(opt, "precomp_enc_text_type")
    bi_gru = opt.get("bi_gru")
    variant = scan_variant(opt)
    said = ", ".join(_said(opt, key) for key in ("bi_gru", "cross_attn", "agg_func"))
    said += f" (SCAN {variant})" if variant else " (no SCAN variant patchword knows)"
    return ("butd-regions+bigru" if bi_gru else "butd-regions+gru"), said


def imported_model(record: Mapping[str, Any] | None) -> ImportedModel | None:
    """The family, backbone and published datasets of an imported checkpoint, from its ``import.json``
    record (``family`` and the official ``opt``); ``None`` when ``record`` is not an import record."""
    if not record or not isinstance(record.get("family"), str):
        return None
    family = record["family"]
    opt = record.get("opt") if isinstance(record.get("opt"), Mapping) else {}
    basis = []
    backbone = None
    if family in ("seps", "laps"):
        backbone, said = _vision_backbone(family, opt)
        basis.append(said)
    elif family in ("scan", "naaf"):
        backbone, said = _region_backbone(family, opt)
        basis.append(said)
    datasets: tuple[str, ...] = ()
    for key in ("dataset", "data_name"):
        if isinstance(opt.get(key), str):
            datasets = _OPT_DATASETS.get(opt[key], ())
            basis.append(f"opt.{key} `{opt[key]}`")
            break
    if family in ("seps", "laps") and "dataset" not in opt:  # the official arguments.py default
        datasets = _OPT_DATASETS["f30k"]
        basis.append("opt.dataset absent (the official default f30k)")
    recorded = record.get("dataset")  # what the importer read from the opt (import.json's "dataset")
    if not datasets and isinstance(recorded, str) and recorded in ("f30k", "coco"):
        datasets = _OPT_DATASETS[recorded]
        basis.append(f"import.json dataset `{recorded}`")
    variant = scan_variant(opt) if family == "scan" else None
    return ImportedModel(family, backbone, datasets, ", ".join(basis), variant, dict(opt))
