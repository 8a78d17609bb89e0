"""Published results beside measured ones (issue 38, deliverable 3): ``patchword.imports.published`` and the
"Published vs measured here" section of an imported checkpoint's export card.

The expected numbers below are copied from the project's reference notes (``reference/seps_laps.md`` and
``reference/naaf_scan_vse.md``, file and lines cited at each block) in the notes' own layout and parsed here,
independently of the shipped table: changing any number of ``published_results.json`` fails
:func:`test_every_shipped_row_is_the_reference_notes_row`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

from patchword.imports.published import (
    DATASETS,
    METRIC_KEYS,
    caveats,
    compare_rows,
    imported_model,
    measured_metrics,
    published_results,
)

pytestmark = pytest.mark.usefixtures("one_thread")

SIX = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10")

# ---------------------------------------------------------------------------------- the notes' numbers

# reference/seps_laps.md lines 246-249 (§4.1, SEPS paper Table 1): "I2T R@1/5/10 | T2I R@1/5/10 | rSum" for
# Flickr30K 1K, MS-COCO 1K, MS-COCO 5K, one line per backbone.
SEPS_TABLE_1 = """
vit-b-224 | 86.1 93.7 96.9 | 86.9 98.1 99.2 | 560.9 | 89.0 94.8 98.0 | 88.5 99.3 99.8 | 569.5 | 73.9 85.2 92.1 | 73.5 94.5 97.8 | 516.9
vit-b-384 | 90.7 94.4 98.4 | 89.3 99.3 99.5 | 571.5 | 90.9 96.1 98.8 | 91.0 99.5 99.8 | 576.1 | 77.8 88.7 94.8 | 78.5 96.3 98.7 | 534.6
swin-b-224 | 89.8 96.9 98.7 | 88.0 98.9 99.6 | 572.0 | 87.2 94.9 98.3 | 84.7 99.0 99.8 | 563.9 | 71.9 86.0 92.4 | 66.8 92.2 96.8 | 506.1
swin-b-384 | 93.6 98.3 99.2 | 91.6 99.4 99.8 | 581.9 | 89.5 96.5 99.0 | 87.1 99.2 99.9 | 571.2 | 74.7 88.4 94.3 | 70.3 93.8 97.6 | 519.1
"""  # noqa: E501

# reference/seps_laps.md lines 263-266 (§4.2, LAPS as cited in the SEPS table), same layout.
LAPS_PAPER = """
vit-b-224 | 74.0 93.4 97.4 | 62.5 87.3 92.7 | 507.3 | 78.7 95.5 98.3 | 66.2 91.3 96.2 | 526.3 | 57.5 84.0 90.8 | 44.5 74.0 83.6 | 434.4
vit-b-384 | 79.0 96.0 98.1 | 67.3 90.5 94.5 | 525.4 | 78.6 96.3 98.9 | 68.0 92.4 96.8 | 531.0 | 57.4 84.9 92.5 | 46.4 75.8 85.2 | 442.2
swin-b-224 | 82.4 97.4 99.5 | 70.0 91.7 95.4 | 536.3 | 84.0 97.6 99.3 | 72.1 93.7 97.3 | 544.1 | 64.5 89.2 94.4 | 51.6 78.9 87.2 | 465.8
swin-b-384 | 85.1 97.7 99.2 | 74.0 93.0 96.3 | 545.3 | 84.1 97.4 99.2 | 72.1 93.9 97.4 | 544.1 | 67.1 88.6 94.3 | 53.0 79.5 87.6 | 470.1
"""  # noqa: E501

# R@1/R@5 only ("I2T R1 R5 | T2I R1 R5"): family, backbone, dataset, variant, numbers.
TWO_RECALLS = [
    # reference/seps_laps.md line 251: SEPS appendix, CLIP-ViT-B-224 and CLIP-ViT-L (F30K, COCO-5K)
    ("seps", "clip-vit-b", "f30k", "CLIP backbone", "94.7 97.6 | 93.1 97.7"),
    ("seps", "clip-vit-b", "coco5k", "CLIP backbone", "84.1 91.2 | 78.4 95.5"),
    ("seps", "clip-vit-l", "f30k", "CLIP backbone", "95.8 98.4 | 95.1 98.1"),
    ("seps", "clip-vit-l", "coco5k", "CLIP backbone", "86.5 91.7 | 79.3 95.8"),
    # reference/seps_laps.md lines 253-256: SEPS ablation on F30K (backbone not stated)
    ("seps", None, "f30k", "ablation: only sparse text", "78.6 95.1 | 67.2 90.5"),
    ("seps", None, "f30k", "ablation: only dense text", "80.3 80.3 | 80.5 96.8"),
    ("seps", None, "f30k", "ablation: without aggregation", "85.2 96.1 | 84.7 97.3"),
    ("seps", None, "f30k", "ablation: full model", "86.1 96.7 | 86.9 98.1"),
    # reference/seps_laps.md line 268: LAPS with CLIP-B / CLIP-L as cited by SEPS (F30K, COCO-5K)
    ("laps", "clip-vit-b", "f30k", "CLIP backbone", "92.9 99.3 | 80.6 95.5"),
    ("laps", "clip-vit-b", "coco5k", "CLIP backbone", "69.8 90.4 | 54.3 80.0"),
    ("laps", "clip-vit-l", "f30k", "CLIP backbone", "94.6 99.9 | 84.9 97.3"),
    ("laps", "clip-vit-l", "coco5k", "CLIP backbone", "72.9 91.7 | 57.1 81.3"),
    # reference/seps_laps.md lines 273-278: the LAPS README's "reproduced" table (copy errors kept)
    *(
        ("laps", backbone, dataset, "README: reproduced with the released checkpoints", numbers)
        for backbone, dataset, numbers in (
            ("vit-b-224", "f30k", "75.8 93.8 | 62.5 87.5"),
            ("swin-b-224", "f30k", "84.5 97.7 | 72.3 92.7"),
            ("vit-b-224", "coco1k", "78.6 96.0 | 65.5 91.4"),
            ("swin-b-224", "coco1k", "83.9 97.9 | 51.2 79.3"),
            ("vit-b-224", "coco5k", "56.1 83.9 | 71.9 93.7"),
            ("swin-b-224", "coco5k", "65.1 90.2 | 51.2 79.3"),
        )
    ),
]

BUTD, GLOVE = "butd-regions+bigru", "butd-regions+glove-bigru"
# "I2T R@1/5/10 | T2I R@1/5/10 | rSum": family, backbone, dataset, variant, numbers.
SIX_RECALLS = [
    # reference/naaf_scan_vse.md lines 380-383 (§5.1, SCAN): tutorial rows and the VSE-infinity supplement's
    # ensembles (F30K t-i AVG + i-t LSE; COCO t-i LSE + i-t AVG)
    ("scan", BUTD, "f30k", "t-i AVG (lambda1=9)", "61.8/87.5/93.7 | 45.8/74.4/83.0 | 446.2"),
    ("scan", BUTD, "coco1k", "t-i AVG (lambda1=9)", "70.9/94.5/97.8 | 56.4/87.0/93.9 | 500.5"),
    ("scan", BUTD, "f30k", "i-t AVG (lambda1=4)", "67.9/89.0/94.4 | 43.9/74.2/82.8 | 452.2"),
    ("scan", BUTD, "coco1k", "i-t AVG (lambda1=4)", "69.2/93.2/97.5 | 54.4/86.0/93.6 | 493.9"),
    ("scan", BUTD, "coco5k", "i-t LSE", "46.4/77.4/87.2 | 34.4/63.7/75.7 | 384.8"),
    ("scan", BUTD, "f30k", "ensemble: t-i AVG + i-t LSE", "67.4/90.3/95.8 | 48.6/77.7/85.2 | 465.0"),
    ("scan", BUTD, "coco1k", "ensemble: t-i LSE + i-t AVG", "72.7/94.8/98.4 | 58.8/88.4/94.8 | 507.9"),
    ("scan", BUTD, "coco5k", "ensemble: t-i LSE + i-t AVG", "50.4/82.2/90.0 | 38.6/69.3/80.4 | 410.9"),
    # reference/naaf_scan_vse.md lines 391-395 (§5.2, NAAF README; COCO = 1K 5-fold as the notes assume)
    ("naaf", BUTD, "f30k", "single", "75.9/93.6/97.7 | 55.5/81.0/87.9 | 491.5"),
    ("naaf", BUTD, "coco1k", "single", "76.8/95.2/98.2 | 61.3/90.6/96.0 | 518.2"),
    ("naaf", BUTD, "f30k", "ensemble", "78.3/94.1/97.7 | 58.9/83.3/89.0 | 501.3"),
    ("naaf", BUTD, "coco1k", "ensemble", "78.9/96.0/98.7 | 63.1/90.8/96.5 | 524.0"),
    ("naaf", GLOVE, "f30k", "single", "79.6/96.3/98.3 | 59.3/83.9/90.2 | 507.6"),
    ("naaf", GLOVE, "coco1k", "single", "78.1/96.1/98.6 | 63.5/89.6/95.3 | 521.2"),
    ("naaf", GLOVE, "f30k", "ensemble", "81.9/96.1/98.3 | 61.0/85.3/90.6 | 513.2"),
    ("naaf", GLOVE, "coco1k", "ensemble", "80.5/96.5/98.8 | 64.1/90.7/96.5 | 527.2"),
    (
        "naaf",
        GLOVE,
        "f30k",
        "released F30K checkpoint (batch 256)",
        "80.6/95.4/98.0 | 60.0/83.9/89.9 | 507.9",
    ),
]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.replace("/", " ").split()]


def _expected() -> dict[tuple, dict[str, float | None]]:
    """(family, backbone, dataset, variant) -> the seven numbers, as the notes print them."""
    expected = {}
    for family, table in (("seps", SEPS_TABLE_1), ("laps", LAPS_PAPER)):
        for line in table.strip().splitlines():
            backbone, *cells = [cell.strip() for cell in line.split("|")]
            for i, dataset in enumerate(("f30k", "coco1k", "coco5k")):
                i2t, t2i, rsum = cells[3 * i : 3 * i + 3]
                expected[family, backbone, dataset, ""] = dict(
                    zip(METRIC_KEYS, [*_floats(i2t), *_floats(t2i), float(rsum)], strict=True)
                )
    for family, backbone, dataset, variant, numbers in TWO_RECALLS:
        i2t, t2i = (_floats(part) for part in numbers.split("|"))
        values = [*i2t, None, *t2i, None, None]
        expected[family, backbone, dataset, variant] = dict(zip(METRIC_KEYS, values, strict=True))
    for family, backbone, dataset, variant, numbers in SIX_RECALLS:
        i2t, t2i, rsum = numbers.split("|")
        values = [*_floats(i2t), *_floats(t2i), float(rsum)]
        expected[family, backbone, dataset, variant] = dict(zip(METRIC_KEYS, values, strict=True))
    return expected


def _mismatches(rows, expected) -> list[str]:
    """Every way ``rows`` differ from ``expected``: a row not in the notes, a missing row, a number."""
    found = []
    shipped = {(r.family, r.backbone, r.dataset, r.variant): r for r in rows}
    found += [f"not in the notes: {key}" for key in shipped.keys() - expected.keys()]
    found += [f"missing: {key}" for key in expected.keys() - shipped.keys()]
    for key in shipped.keys() & expected.keys():
        if shipped[key].metrics() != expected[key]:
            found.append(f"{key}: {shipped[key].metrics()} != {expected[key]}")
    return found


# ---------------------------------------------------------------------------------- the table


def test_every_shipped_row_is_the_reference_notes_row():
    rows = published_results()
    keys = [(r.family, r.backbone, r.dataset, r.variant) for r in rows]
    assert len(keys) == len(set(keys)) == 59  # one row per method, backbone, dataset and variant
    assert _mismatches(rows, _expected()) == []
    # a number changed in the table is caught, and so is a row added
    changed = dataclasses.replace(rows[0], i2t_r5=96.7)
    assert _mismatches([changed, *rows[1:]], _expected()) == [
        f"('seps', 'vit-b-224', 'f30k', ''): {changed.metrics()} != {rows[0].metrics()}"
    ]
    extra = dataclasses.replace(rows[0], variant="invented")
    assert _mismatches([*rows, extra], _expected()) == [
        "not in the notes: ('seps', 'vit-b-224', 'f30k', 'invented')"
    ]


def test_the_table_is_package_data_and_every_row_says_where_it_comes_from():
    root = pathlib.Path(__file__).resolve().parents[2]
    assert '"imports/*.json"' in (root / "pyproject.toml").read_text()  # installed with the package
    raw = json.loads((root / "src/patchword/imports/published_results.json").read_text())
    assert len(raw["rows"]) == len(published_results())
    for row in published_results():
        assert row.source and row.protocol and row.dataset in DATASETS
        assert row.leaky == (row.family == "seps" and row.variant != "ablation: only sparse text")
        assert ("LEAKY" in row.protocol) == row.leaky
    per_family = {
        f: len(published_results(family=f)) for f in ("seps", "laps", "scan", "naaf", "tgdt", "ucmfh")
    }
    assert per_family == {"seps": 20, "laps": 22, "scan": 8, "naaf": 9, "tgdt": 0, "ucmfh": 0}


# Hand-checked sums of the six printed recalls where the published rSum differs (published - sum):
GAPS = {
    ("seps", "vit-b-224", "coco1k"): 0.1,  # 89.0+94.8+98.0+88.5+99.3+99.8 = 569.4, published 569.5
    ("seps", "vit-b-224", "coco5k"): -0.1,  # 73.9+85.2+92.1+73.5+94.5+97.8 = 517.0, published 516.9
    ("seps", "vit-b-384", "f30k"): -0.1,  # 90.7+94.4+98.4+89.3+99.3+99.5 = 571.6, published 571.5
    ("seps", "vit-b-384", "coco5k"): -0.2,  # 77.8+88.7+94.8+78.5+96.3+98.7 = 534.8, published 534.6
    ("seps", "swin-b-224", "f30k"): 0.1,  # 89.8+96.9+98.7+88.0+98.9+99.6 = 571.9, published 572.0
    ("laps", "vit-b-224", "coco1k"): 0.1,  # 78.7+95.5+98.3+66.2+91.3+96.2 = 526.2, published 526.3
    ("laps", "swin-b-224", "f30k"): -0.1,  # 82.4+97.4+99.5+70.0+91.7+95.4 = 536.4, published 536.3
    ("laps", "swin-b-224", "coco1k"): 0.1,  # 84.0+97.6+99.3+72.1+93.7+97.3 = 544.0, published 544.1
    ("naaf", BUTD, "f30k"): -0.1,  # single: 75.9+93.6+97.7+55.5+81.0+87.9 = 491.6, published 491.5
    ("naaf", BUTD, "coco1k"): 0.1,  # single: 76.8+95.2+98.2+61.3+90.6+96.0 = 518.1, published 518.2
    ("naaf", GLOVE, "coco1k"): 0.1,  # ensemble: 80.5+96.5+98.8+64.1+90.7+96.5 = 527.1, published 527.2
    ("naaf", GLOVE, "f30k"): 0.1,  # released: 80.6+95.4+98.0+60.0+83.9+89.9 = 507.8, published 507.9
}


def test_a_published_rsum_that_is_not_the_sum_of_its_recalls_is_kept_and_noted():
    gaps = {}
    for row in published_results():
        gap = row.rsum_gap()
        if row.rsum is None:
            assert gap is None and None in [row.i2t_r10, row.t2i_r10]  # R@1/R@5-only rows
        elif gap != 0.0:
            gaps[row.family, row.backbone, row.dataset] = gap
            assert f"rSum {row.rsum} differs by {abs(gap)} from the sum" in row.note, row
            assert f"({row.recall_sum()})" in row.note
        else:
            assert "differs by" not in row.note
    assert gaps == GAPS
    assert published_results("seps", "vit-b-224", "f30k")[0].recall_sum() == 560.9  # 86.1+...+99.2


def test_the_mismatches_as_published_stay_visible():
    (seps,) = published_results("seps", "vit-b-224", "f30k")
    assert (seps.t2i_r1, seps.i2t_r1) == (
        86.9,
        86.1,
    ) and "T2I R@1 (86.9) is above I2T R@1 (86.1)" in seps.note
    assert "96.7" in seps.note  # the ablation table's I2T R@5 for the same model
    readme = {r.dataset: r for r in published_results("laps", "swin-b-224") if r.variant.startswith("README")}
    assert (readme["coco1k"].t2i_r1, readme["coco1k"].t2i_r5) == (
        readme["coco5k"].t2i_r1,
        readme["coco5k"].t2i_r5,
    )
    assert "same as the README's COCO-5K Swin row" in readme["coco1k"].note
    (vit5k,) = [r for r in published_results("laps", "vit-b-224", "coco5k") if r.variant.startswith("README")]
    assert vit5k.t2i_r1 > vit5k.i2t_r1 and "copy error" in vit5k.note
    for row in published_results():  # every T2I R@1 above I2T R@1 is said
        if row.t2i_r1 > row.i2t_r1:
            assert "above I2T" in row.note, row


def test_lookup_by_family_backbone_and_dataset():
    assert [r.rsum for r in published_results("seps", "vit-b-384")] == [571.5, 576.1, 534.6]
    assert [r.rsum for r in published_results("laps", "swin-b-384", "coco1k")] == [544.1]
    assert {r.dataset for r in published_results(dataset="coco5k")} == {"coco5k"}
    assert {r.family for r in published_results(backbone=GLOVE)} == {"naaf"}
    assert [r.variant for r in published_results("naaf", GLOVE, "f30k")] == [
        "single",
        "ensemble",
        "released F30K checkpoint (batch 256)",
    ]
    assert [r.variant for r in published_results("laps", "vit-b-224", "f30k")] == [
        "",
        "README: reproduced with the released checkpoints",
    ]
    assert published_results("tgdt") == [] and published_results("seps", "vit-l-999") == []
    assert len(published_results()) == 59
    with pytest.raises(ValueError, match="coco1k"):
        published_results(dataset="coco")


# ---------------------------------------------------------------------------------- comparing


def test_compare_rows_gives_published_measured_and_their_difference():
    (seps,) = published_results("seps", "vit-b-224", "f30k")
    measured = {
        "i2t_r1": 80.0,
        "i2t_r5": 90.5,
        "i2t_r10": 95.0,
        "t2i_r1": 70.2,
        "t2i_r5": 88.0,
        "t2i_r10": 93.1,
    }
    measured["rsum"] = 516.8
    published, here, difference = compare_rows(seps, measured)
    assert published == {"row": "published", "i2t_r1": 86.1, "i2t_r5": 93.7, "i2t_r10": 96.9, "t2i_r1": 86.9,
                         "t2i_r5": 98.1, "t2i_r10": 99.2, "rsum": 560.9}  # fmt: skip
    assert here == {"row": "measured here", **measured}
    # by hand: 80.0-86.1, 90.5-93.7, 95.0-96.9, 70.2-86.9, 88.0-98.1, 93.1-99.2, 516.8-560.9
    hand = [-6.1, -3.2, -1.9, -16.7, -10.1, -6.1, -44.1]
    assert difference["row"] == "difference"
    assert [difference[k] for k in METRIC_KEYS] == pytest.approx(hand, abs=1e-9)
    # a recall the source does not print, and one not measured: no difference
    (readme,) = [r for r in published_results("laps", "vit-b-224", "f30k") if r.variant]
    _, here, difference = compare_rows(readme, {"i2t_r1": 75.0, "t2i_r5": 90.0})
    assert difference["i2t_r1"] == pytest.approx(-0.8) and difference["t2i_r5"] == pytest.approx(2.5)
    assert difference["i2t_r10"] is None and difference["rsum"] is None and here["i2t_r5"] is None
    # nothing measured: the published row only has numbers
    published, here, difference = compare_rows(seps, None)
    assert all(here[k] is None and difference[k] is None for k in METRIC_KEYS)
    assert compare_rows(seps, {}) == compare_rows(seps, None)


def test_measured_metrics_read_the_dataset_the_published_row_reports():
    record = {
        **{k: 10.0 for k in SIX},
        "rsum": 60.0,
        **{f"coco1k_{k}": 20.0 for k in SIX},
        "coco1k_rsum": 120.0,
    }
    assert measured_metrics(record, "coco5k") == {**{k: 10.0 for k in SIX}, "rsum": 60.0}
    assert measured_metrics(record, "f30k")["rsum"] == 60.0
    assert measured_metrics(record, "coco1k") == {**{k: 20.0 for k in SIX}, "rsum": 120.0}
    assert measured_metrics({"rsum": 60.0}, "coco1k") == {} and measured_metrics(None, "f30k") == {}


def test_caveats_say_when_the_comparison_is_not_like_for_like():
    (seps,) = published_results("seps", "vit-b-224", "f30k")
    (laps,) = [r for r in published_results("laps", "vit-b-224", "coco1k") if not r.variant]
    assert caveats(seps, {"images": 1000, "leaky": True}) == []
    assert caveats(laps, {"images": 5000, "leaky": False}) == []  # COCO 1K: folds of the 5K split
    assert caveats(seps, {"images": 4, "leaky": False}) == [
        "measured on 4 test images, the published Flickr30K 1K protocol on 1000: not a like-for-like "
        "comparison",
        "published with a LEAKY protocol, measured here leak-free",
    ]
    assert caveats(seps, {}) == []


F30K, COCO = ("f30k",), ("coco1k", "coco5k")


@pytest.mark.parametrize(
    ("family", "opt", "backbone", "datasets"),
    [
        ("seps", {"vit_type": "vit", "dataset": "f30k"}, "vit-b-224", F30K),
        ("seps", {"vit_type": "swin_384", "dataset": "coco"}, "swin-b-384", COCO),
        # LAPS builds 224-pixel backbones whatever the suffix (reference/seps_laps.md line 93)
        ("laps", {"vit_type": "vit_384", "dataset": "f30k"}, "vit-b-224", F30K),
        ("laps", {"vit_type": "swin"}, "swin-b-224", F30K),  # opt.dataset: the arguments.py default
        ("naaf", {"precomp_enc_text_type": "GloVe", "data_name": "f30k_precomp"}, GLOVE, F30K),
        ("naaf", {"precomp_enc_text_type": "basic", "data_name": "coco_precomp"}, BUTD, COCO),
        ("scan", {"bi_gru": True, "data_name": "f30k_precomp"}, BUTD, F30K),
        ("scan", {"bi_gru": False, "data_name": "f30k_precomp"}, "butd-regions+gru", F30K),
        ("tgdt", {}, None, ()),
    ],
)
def test_an_import_record_names_its_backbone_and_datasets(family, opt, backbone, datasets):
    model = imported_model({"family": family, "opt": opt, "source": "model_best.pth"})
    assert (model.family, model.backbone, model.datasets) == (family, backbone, datasets)
    assert all(f"`{value}`" in model.basis for value in opt.values() if isinstance(value, str))


def test_a_run_that_was_not_imported_has_no_import_record():
    assert imported_model({}) is None and imported_model(None) is None


# ---------------------------------------------------------------------------------- the export card


def test_the_export_card_of_an_imported_official_checkpoint_shows_published_and_measured(tmp_path):
    """A tiny checkpoint in the official SEPS layout (``opt.vit_type=vit``, ``opt.dataset=f30k``) imported
    with the data of a tiny LAPS-layout dataset: before ``patchword eval`` its card shows the SEPS paper's
    ViT-B-224 Flickr30K row and "not measured here yet"; after it, the measured row and the difference."""
    import torch
    import transformers

    from conftest import write_laps_dataset
    from patchword.cli import main
    from patchword.imports import ImportOptions, import_checkpoint
    from patchword.testing.official_seps import BERT, VIT, VOCAB, official_checkpoint

    torch.manual_seed(0)
    transformers.ViTModel(transformers.ViTConfig(**VIT), add_pooling_layer=False).save_pretrained(
        tmp_path / "vit"
    )
    transformers.BertModel(transformers.BertConfig(**BERT)).save_pretrained(tmp_path / "bert")
    (tmp_path / "bert" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    data = write_laps_dataset(tmp_path / "laps")
    torch.save(official_checkpoint("vit", embed=24), tmp_path / "model_best.pth")
    overrides = [f"data.{key}={data[key]}" for key in ("root", "image_root", "dense_train", "dense_test")]
    options = ImportOptions(
        hf_vision=str(tmp_path / "vit"), hf_text=str(tmp_path / "bert"), overrides=overrides
    )
    run = tmp_path / "run"
    import_checkpoint(tmp_path / "model_best.pth", run, family_name="seps", options=options)

    published = "| published | 86.1 | 93.7 | 96.9 | 86.9 | 98.1 | 99.2 | 560.9 |"
    assert main(["export", str(run), str(tmp_path / "before")]) == 0
    card = (tmp_path / "before" / "README.md").read_text()
    section = card[card.index("## Published vs measured here") :]
    assert "backbone `vit-b-224` on Flickr30K 1K" in section and "opt.vit_type `vit`" in section
    assert published in section and "| measured here | not measured here yet |" in section
    assert "Not measured here yet" in section and "| difference |" not in section
    assert "SEPS paper" in section and "Table 1" in section and "LEAKY" in section
    assert "T2I R@1 (86.9) is above I2T R@1 (86.1)" in section

    assert main(["eval", str(run)]) == 0
    measured = json.loads((run / "eval_test.json").read_text())
    assert main(["export", str(run), str(tmp_path / "after")]) == 0
    card = (tmp_path / "after" / "README.md").read_text()
    section = card[card.index("## Published vs measured here") :]
    (seps,) = published_results("seps", "vit-b-224", "f30k")
    assert published in section
    assert "| measured here | " + " | ".join(f"{measured[k]:.1f}" for k in METRIC_KEYS) + " |" in section
    assert (
        "| difference | " + " | ".join(f"{measured[k] - v:+.1f}" for k, v in seps.metrics().items())
        in section
    )
    assert "Measured here: `eval_test.json`, split test, 4 images, leak-free protocol." in section
    assert "measured on 4 test images, the published Flickr30K 1K protocol on 1000" in section
    assert "published with a LEAKY protocol, measured here leak-free" in section

    # patchword report shows the same comparison beside the run's other rows
    out = tmp_path / "report.md"
    assert main(["report", str(run), "--out", str(out)]) == 0
    text = out.read_text()
    assert (
        "| run | Flickr30K 1K | published [1] | 86.1 | 93.7 | 96.9 | 86.9 | 98.1 | 99.2 | 560.9 | SEPS paper"
        in text
    )
    # its note under the table, as the card shows it
    assert "\n[1] Flickr30K 1K: protocol: Flickr30K 1K test: 1000 images, 5000 captions;" in text
    assert "T2I R@1 (86.9) is above I2T R@1 (86.1)" in text[text.index("\n[1] Flickr30K 1K") :]
    here = " | ".join(f"{measured[k]:.1f}" for k in METRIC_KEYS)
    assert f"| run | Flickr30K 1K | measured here | {here} |" in text
    diff = " | ".join(f"{measured[k] - v:+.1f}" for k, v in seps.metrics().items())
    assert f"| run | Flickr30K 1K | difference | {diff} |" in text
    assert "NOT LIKE FOR LIKE: run, Flickr30K 1K: measured on 4 test images" in text
