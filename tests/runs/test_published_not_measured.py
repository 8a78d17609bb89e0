"""Why a published row has no "measured here" figures is said the same way by ``patchword report`` and by
the export card (``patchword.imports.published.not_measured``). Before, the card said "not measured here
yet" beside a COCO 1K row of an evaluation made without ``eval.coco_1k`` (the run was evaluated; only the
five folds' averages, which that setting alone records, were missing), while the report said why."""

from __future__ import annotations

from patchword.eval.metrics import RECALL_KEYS
from patchword.imports.published import measured_metrics, not_measured
from patchword.runs.card import _published_section

#: an imported official SCAN checkpoint trained on MS-COCO (t-i AVG): published MS-COCO 1K and 5K rows
SCAN_COCO = {
    "family": "scan",
    "opt": {
        "bi_gru": True,
        "data_name": "coco_precomp",
        "cross_attn": "t2i",
        "agg_func": "Mean",
        "lambda_softmax": 9.0,
    },
}
#: an evaluation of the 5K test split without eval.coco_1k: no coco1k_* fold averages
FIVE_K = {key: 50.0 for key in RECALL_KEYS} | {"rsum": 300.0, "split": "testall", "images": 5000}


def test_why_a_row_is_not_measured():
    assert not_measured({}, {}, "f30k", coco_1k=False) == "not measured here yet"
    assert not_measured(FIVE_K, measured_metrics(FIVE_K, "coco5k"), "coco5k", coco_1k=False) == ""
    unset = not_measured(FIVE_K, measured_metrics(FIVE_K, "coco1k"), "coco1k", coco_1k=False)
    assert unset == "not measured: eval.coco_1k was not set"
    figures = not_measured(FIVE_K, {}, "coco1k", coco_1k=True)
    assert figures == "not measured: the evaluation records no MS-COCO 1K figures"


def test_the_cards_coco_1k_row_says_why_it_is_not_measured():
    record = {"checkpoint": "best.pt", "metrics_source": "eval_testall.json"}
    section = "\n".join(_published_section(SCAN_COCO, FIVE_K, record))
    assert "**MS-COCO 1K, t-i AVG" in section
    assert "| measured here | not measured: eval.coco_1k was not set |" in section
    assert "not measured here yet" not in section and "| difference |" not in section
    section = "\n".join(_published_section(SCAN_COCO, FIVE_K, record, None, True))
    assert "| measured here | not measured: the evaluation records no MS-COCO 1K figures |" in section
    folds = FIVE_K | {f"coco1k_{key}": 60.0 for key in RECALL_KEYS}
    section = "\n".join(_published_section(SCAN_COCO, folds, record))
    assert "| measured here | 60.0 |" in section and "| difference |" in section
