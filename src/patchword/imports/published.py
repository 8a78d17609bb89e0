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
``import.json``, the backbone as :func:`imported_model` derives it from the checkpoint's ``opt``. Everything
here is pure, for ``patchword report`` and the export card: the only file read is the shipped table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from patchword.eval.metrics import RECALL_KEYS

__all__ = [
    "DATASETS",
    "METRIC_KEYS",
    "TEST_IMAGES",
    "ImportedModel",
    "PublishedResult",
    "caveats",
    "compare_rows",
    "imported_model",
    "measured_metrics",
    "published_results",
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
    """

    family: str
    backbone: str | None
    datasets: tuple[str, ...]
    basis: str

    def published(self) -> list[PublishedResult]:
        """The table's rows for this checkpoint: its family and backbone on each of its datasets; none
        when the backbone is unknown (``published_results`` would take None for "any backbone")."""
        if self.backbone is None:
            return []
        return [row for d in self.datasets for row in published_results(self.family, self.backbone, d)]


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


def caveats(published: PublishedResult, record: Mapping[str, Any] | None) -> list[str]:
    """Why a recorded evaluation (``eval_*.json`` / ``summary.json``) is not a like-for-like comparison with
    ``published``: another number of test images, another protocol (leaky or not). ``[]`` when nothing
    recorded says so (or nothing is recorded)."""
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
    return found


def _vision_backbone(family: str, opt: Mapping[str, Any]) -> tuple[str | None, str]:
    """SEPS / LAPS: the backbone the official code loads for ``opt.vit_type`` (``vit`` / ``swin``, with a
    ``_224`` / ``_384`` suffix that only SEPS reads: LAPS builds 224-pixel backbones whatever it says)."""
    vit_type = opt.get("vit_type")
    if not isinstance(vit_type, str) or vit_type.split("_")[0] not in ("vit", "swin"):
        return None, f"opt.vit_type {vit_type!r}"
    size = "384" if family == "seps" and vit_type.endswith("_384") else "224"
    return f"{vit_type.split('_')[0]}-b-{size}", f"opt.vit_type `{vit_type}`"


def _region_backbone(family: str, opt: Mapping[str, Any]) -> tuple[str | None, str]:
    """SCAN / NAAF: bottom-up regions and a (bidirectional) GRU over random or GloVe word embeddings."""
    if family == "naaf":
        text = opt.get("precomp_enc_text_type")
        return _NAAF_TEXT.get(text), f"opt.precomp_enc_text_type `{text}`"
    bi_gru = opt.get("bi_gru")
    return ("butd-regions+bigru" if bi_gru else "butd-regions+gru"), f"opt.bi_gru `{bi_gru}`"


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
    return ImportedModel(family, backbone, datasets, ", ".join(basis))
