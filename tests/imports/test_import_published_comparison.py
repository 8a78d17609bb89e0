"""What an imported official checkpoint is compared with, and what the comparison says (review 54).

* A published row is measured on its protocol's test split of its dataset: an evaluation of another split
  (``dev``; COCO's 1K ``test`` for a ``testall`` row) or of other data (``data.root`` overridden to COCO
  for a Flickr30K checkpoint) is NOT LIKE FOR LIKE, in ``patchword report`` and in the export card.
* A SCAN checkpoint is one variant (``opt.cross_attn`` x ``opt.agg_func``): only that variant's rows and
  the ensembles it is a member of are its published results, and an ensemble's row (SCAN, NAAF) beside one
  model says so.
* Malformed or unknown ``opt`` fields are one error line naming them (exit 2), never a traceback and never
  a fork scored as plain SCAN.
* import.json names its source by absolute path and records the dataset the ``opt`` implies.

The evaluations are written as ``patchword eval`` writes them (:func:`record_evaluation`), with made-up
recalls: what is checked is what the report and the card say about them, not the numbers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from test_import_scan_naaf import (
    GLOVE_SPECIALS,
    SCAN_SPECIALS,
    naaf_opt,
    official_checkpoint,
    scan_opt,
    vocab_words,
    write_json_vocab,
)

from conftest import one_error_line
from patchword.cli import main
from patchword.errors import ConfigError, DataError
from patchword.imports import IMPORT_FILE, ImportOptions, import_checkpoint
from patchword.imports.published import caveats, imported_model, published_results
from patchword.runs.load import config_hash
from patchword.runs.recorded import file_sha256

pytestmark = pytest.mark.usefixtures("one_thread")

MEASURED = dict(i2t_r1=80.0, i2t_r5=90.0, i2t_r10=95.0, t2i_r1=70.0, t2i_r5=85.0, t2i_r10=90.0, rsum=510.0)
F30K_DATA = {"dataset": "precomp", "root": "data/f30k_precomp", "test_split": "test", "dev_split": "dev"}
COCO_DATA = {"dataset": "precomp", "root": "data/coco_precomp", "test_split": "testall", "dev_split": "dev"}
T_I_AVG = {"cross_attn": "t2i", "agg_func": "Mean", "lambda_softmax": 9.0}


def record_evaluation(run: Path, role: str, images: int, **extra) -> None:
    """``eval_<role>.json`` as ``patchword eval`` records it for the run's best.pt (its digest, the config
    hash), so that the report and the export take it for the run's evaluation."""
    record = {
        "run_dir": str(run),
        "checkpoint": str(run / "best.pt"),
        "checkpoint_step": 0,
        "checkpoint_sha256": file_sha256(run / "best.pt"),
        "config_hash": config_hash(run),
        "split": role,
        "images": images,
        "captions": 5 * images,
        "leaky": False,
        **MEASURED,
        **extra,
    }
    (run / f"eval_{role}.json").write_text(json.dumps(record))


def import_scan(tmp_path: Path, name: str, overrides=(), **opt_changes) -> Path:
    """A tiny official SCAN checkpoint (``opt_changes`` on the README's flags) imported as runs/<name>."""
    ckpt = tmp_path / f"{name}.pth.tar"
    torch.save(official_checkpoint(scan_opt(**opt_changes)), ckpt)
    vocab = write_json_vocab(tmp_path / "vocab.json", vocab_words(SCAN_SPECIALS))
    run = tmp_path / "runs" / name
    import_checkpoint(ckpt, run, options=ImportOptions(vocab=str(vocab), overrides=list(overrides)))
    return run


def scan_model(data_name: str = "f30k_precomp", **opt):
    return imported_model({"family": "scan", "opt": {"bi_gru": True, "data_name": data_name, **opt}})


# --------------------------------------------------------------------------- split and dataset (issue 1)


def test_report_and_card_say_when_another_split_or_dataset_was_measured(tmp_path, capsys):
    """Before: only the image count and the leak were compared, so a Flickr30K checkpoint scored on its
    1000-image dev split, or on COCO data put under data.root, stood beside the published Flickr30K test
    rows with no caveat."""
    dev = import_scan(tmp_path, "dev", ["eval.split=dev"], **T_I_AVG)
    record_evaluation(dev, "dev", 1000)
    coco = import_scan(tmp_path, "coco_data", ["data.root=/datasets/coco_precomp"], **T_I_AVG)
    record_evaluation(coco, "test", 1000)
    fine = import_scan(tmp_path, "fine", ["data.root=/datasets/f30k_precomp"], **T_I_AVG)
    record_evaluation(fine, "test", 1000)

    split = "measured on split `dev`, the published Flickr30K 1K protocol on split `test` (its test split)"
    data = "measured on MS-COCO data (data.root `/datasets/coco_precomp`), the published Flickr30K 1K row"
    out = tmp_path / "report.md"
    assert main(["report", str(dev), str(coco), str(fine), "--out", str(out)]) == 0
    captions = [line for line in out.read_text().splitlines() if "NOT LIKE FOR LIKE" in line]
    assert len(captions) == 1, out.read_text()
    caption = captions[0]
    assert f"dev, Flickr30K 1K, t-i AVG (lambda1=9): {split}" in caption
    assert f"coco_data, Flickr30K 1K, t-i AVG (lambda1=9): {data}" in caption
    assert "fine, Flickr30K 1K, t-i AVG (lambda1=9)" not in caption  # its test split of Flickr30K data

    for run, expected in ((dev, split), (coco, data)):
        assert main(["export", str(run), str(tmp_path / f"export_{run.name}")]) == 0
        card = (tmp_path / f"export_{run.name}" / "README.md").read_text()
        assert "with backbone `butd-regions+bigru` (variant t-i AVG) on Flickr30K 1K" in card
        single = card[card.index("**Flickr30K 1K, t-i AVG (lambda1=9)**") :]
        single = single[: single.index("**Flickr30K 1K, ensemble")]
        assert f"* caveat: {expected}" in single
    capsys.readouterr()


def test_a_coco_row_needs_the_5k_testall_split():
    """COCO's own ``test`` split is a single 1K set; the published COCO rows are measured on ``testall``
    (COCO 1K: its five folds). The record names the role it scored; the run's data config names the
    split that role read."""
    (row,) = [r for r in published_results("scan", "butd-regions+bigru", "coco5k") if r.variant == "i-t LSE"]
    record = {"split": "test", "images": 5000, "leaky": False, **MEASURED}
    assert caveats(row, record, COCO_DATA) == []
    assert caveats(row, record, {**COCO_DATA, "test_split": "test"}) == [
        "measured on split `test`, the published MS-COCO 5K protocol on split `testall` (its test split): "
        "not a like-for-like comparison"
    ]
    assert "split `dev`" in caveats(row, {**record, "split": "dev"}, COCO_DATA)[0]
    # without the data config a "test" role cannot be named (taken on trust), a "dev" one can
    assert caveats(row, record) == [] and "split `dev`" in caveats(row, {**record, "split": "dev"})[0]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({**F30K_DATA, "root": "/mnt/Flickr30k/precomp"}, None),
        ({**F30K_DATA, "root": "/mnt/mscoco/f30k_precomp"}, None),  # the last component that names one
        ({**F30K_DATA, "root": "/mnt/flickr8k"}, "measured on Flickr8K data (data.root `/mnt/flickr8k`)"),
        ({**F30K_DATA, "root": "data/coco"}, "measured on MS-COCO data (data.root `data/coco`)"),
        ({**F30K_DATA, "root": "/mnt/set1"}, "data.root `/mnt/set1` names neither Flickr30K nor MS-COCO"),
        ({**F30K_DATA, "dataset": "synthetic_regions"}, "measured on synthetic data"),
    ],
)
def test_the_data_measured_is_compared_with_the_rows_dataset(data, expected):
    (row,) = [
        r for r in published_results("naaf", "butd-regions+glove-bigru", "f30k") if r.variant == "single"
    ]
    found = caveats(row, {"split": "test", "images": 1000, "leaky": False, **MEASURED}, data)
    assert found == [] if expected is None else len(found) == 1 and found[0].startswith(expected)


# --------------------------------------------------------------------------- variants, ensembles (issue 2)


@pytest.mark.parametrize(
    ("opt", "data_name", "rows"),
    [
        # t-i LSE on Flickr30K: the table has no row of it, nor an ensemble it is a member of
        ({"cross_attn": "t2i", "agg_func": "LogSumExp"}, "f30k_precomp", []),
        (
            {"cross_attn": "t2i", "agg_func": "Mean"},
            "f30k_precomp",
            [("f30k", "t-i AVG (lambda1=9)"), ("f30k", "ensemble: t-i AVG + i-t LSE")],
        ),
        (
            {"cross_attn": "t2i", "agg_func": "LogSumExp"},
            "coco_precomp",
            [("coco1k", "ensemble: t-i LSE + i-t AVG"), ("coco5k", "ensemble: t-i LSE + i-t AVG")],
        ),
        ({"cross_attn": "i2t", "agg_func": "LogSumExp"}, "coco_precomp", [("coco5k", "i-t LSE")]),
        ({"cross_attn": "i2t", "agg_func": "Max"}, "coco_precomp", []),
        ({}, "f30k_precomp", []),  # no variant named: nothing to compare with
    ],
)
def test_a_scan_checkpoint_is_compared_with_its_own_variant_only(opt, data_name, rows):
    """Before: every SCAN row of the backbone, so a t2i LogSumExp checkpoint got "difference" rows
    against t-i AVG, i-t AVG and the t-i AVG + i-t LSE ensemble."""
    model = scan_model(data_name, **opt)
    assert [(r.dataset, r.variant) for r in model.published()] == rows
    if opt:
        assert f"opt.cross_attn `{opt['cross_attn']}`" in model.basis


def test_every_ensemble_row_says_it_is_two_models_and_a_single_row_does_not():
    record = {"split": "test", "images": 1000, "leaky": False, **MEASURED}
    rows = published_results("scan") + published_results("naaf")
    ensembles = [r for r in rows if r.variant.startswith("ensemble")]
    assert len(ensembles) == 7
    for row in rows:
        found = [
            text
            for text in caveats(row, {**record, "images": 1000 if row.dataset == "f30k" else 5000})
            if "two-model ensemble" in text
        ]
        if row in ensembles:
            assert len(found) == 1 and found[0].endswith(
                "two models' similarities averaged), measured here: one model: not a like-for-like comparison"
            )
            assert row.family == "naaf" or f"({row.variant.removeprefix('ensemble: ')}: two" in found[0]
        else:
            assert found == []


def test_a_scan_row_of_another_lambda_or_variant_says_so():
    (avg,) = [r for r in published_results("scan", dataset="f30k") if r.variant == "t-i AVG (lambda1=9)"]
    record = {"split": "test", "images": 1000, "leaky": False, **MEASURED}
    assert caveats(avg, record, F30K_DATA, scan_model(**T_I_AVG)) == []
    assert caveats(avg, record, F30K_DATA, scan_model(**{**T_I_AVG, "lambda_softmax": 4.0})) == [
        "published with lambda1=9 (opt.lambda_softmax), this checkpoint trained with 4: not a like-for-like "
        "comparison"
    ]
    lse = scan_model(cross_attn="t2i", agg_func="LogSumExp", lambda_softmax=9.0)
    assert caveats(avg, record, F30K_DATA, lse) == [
        "published for another SCAN variant (t-i AVG (lambda1=9)); this checkpoint is SCAN t-i LSE: not a "
        "like-for-like comparison"
    ]


# --------------------------------------------------------------------------- malformed opt (issues 3, 4)


def _seps_checkpoint(path: Path, opt) -> Path:
    from patchword.testing.official_seps import official_checkpoint as seps_checkpoint

    ckpt = seps_checkpoint("vit", embed=24)
    ckpt["opt"] = opt(ckpt["opt"])
    torch.save(ckpt, path)
    return path


@pytest.mark.parametrize(
    ("opt", "expected"),
    [
        (
            lambda o: argparse.Namespace(**{**vars(o), "vit_type": ["vit"]}),
            "error: opt.vit_type: ['vit'] is not",
        ),
        (lambda o: {**vars(o), 3: "x", (1, 2): "y"}, "opt has a field named 3 (int), not a name"),
    ],
)
def test_a_malformed_seps_opt_is_one_error_line_naming_the_field(opt, expected, tmp_path, capsys):
    """Before: TypeError tracebacks (an unhashable list looked up among the backbones; mixed keys
    sorted), exit 1."""
    ckpt = _seps_checkpoint(tmp_path / "model_best.pth", opt)
    out = tmp_path / "run"
    assert main(["import", str(ckpt), "--out", str(out), "--family", "seps"]) == 2
    assert expected in one_error_line(capsys.readouterr().err)
    assert not out.exists()


def test_a_scan_fork_with_options_of_its_own_is_refused_naming_them(tmp_path, capsys):
    """Before: a warning, and a fork (focal attention, order-embedding measure, position embeddings)
    imported and scored as plain SCAN."""
    fork = scan_opt(position_embed=True, focal_type="prob", measure="order")
    torch.save(official_checkpoint(fork), tmp_path / "fork.pth.tar")
    vocab = write_json_vocab(tmp_path / "vocab.json", vocab_words(SCAN_SPECIALS))
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as caught:
        import_checkpoint(tmp_path / "fork.pth.tar", out, options=ImportOptions(vocab=str(vocab)))
    assert caught.value.key == "opt.focal_type"
    assert "unknown opt field(s): focal_type, measure, position_embed" in str(caught.value)
    assert main(["import", str(tmp_path / "fork.pth.tar"), "--out", str(out), "--vocab", str(vocab)]) == 2
    assert "kuanghuei/SCAN train.py" in one_error_line(capsys.readouterr().err)
    assert not out.exists()


def test_naaf_fork_options_are_refused_and_bookkeeping_is_recorded(tmp_path, caplog):
    vocab = write_json_vocab(tmp_path / "vocab.json", vocab_words(GLOVE_SPECIALS), scan_style=False)
    torch.save(official_checkpoint(naaf_opt(margin_schedule="cosine")), tmp_path / "fork.pth.tar")
    with pytest.raises(ConfigError, match="CrossmodalGroup/NAAF train.py .*margin_schedule"):
        import_checkpoint(
            tmp_path / "fork.pth.tar", tmp_path / "fork", options=ImportOptions(vocab=str(vocab))
        )
    # the process bookkeeping of the VSE-infinity / SEPS lineage changes nothing a checkpoint computes
    torch.save(official_checkpoint(naaf_opt(seed=3, gpu_id=0)), tmp_path / "seeded.pth.tar")
    record = import_checkpoint(
        tmp_path / "seeded.pth.tar", tmp_path / "seeded", options=ImportOptions(vocab=str(vocab))
    )
    assert record["metadata"]["unrecognised_opt"] == ["gpu_id", "seed"]
    assert "bookkeeping only (not read): ['gpu_id', 'seed']" in caplog.text


@pytest.mark.parametrize(
    ("opt", "error", "match"),
    [
        (
            lambda o: argparse.Namespace(**{**vars(o), "data_name": ["f30k_precomp"]}),
            ConfigError,
            "data_name",
        ),
        (lambda o: {**vars(o), 7: "x"}, DataError, "opt has a field named 7 \\(int\\)"),
    ],
)
def test_a_malformed_scan_opt_is_refused(opt, error, match, tmp_path):
    """Before: a list data_name became the data root ``data/['f30k_precomp']``; mixed keys a TypeError."""
    ckpt = official_checkpoint(scan_opt())
    ckpt["opt"] = opt(ckpt["opt"])
    torch.save(ckpt, tmp_path / "bad.pth.tar")
    vocab = write_json_vocab(tmp_path / "vocab.json", vocab_words(SCAN_SPECIALS))
    with pytest.raises(error, match=match):
        import_checkpoint(tmp_path / "bad.pth.tar", tmp_path / "run", options=ImportOptions(vocab=str(vocab)))
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- import.json (issues 1, 5)


def test_import_json_names_its_source_absolutely_and_the_dataset_of_the_opt(tmp_path, monkeypatch):
    """Before: the path as typed (relative to wherever the import ran), and no dataset."""
    monkeypatch.chdir(tmp_path)
    torch.save(official_checkpoint(scan_opt(data_name="coco_precomp")), tmp_path / "model_best.pth.tar")
    write_json_vocab(tmp_path / "vocab.json", vocab_words(SCAN_SPECIALS))
    import_checkpoint("model_best.pth.tar", "run", options=ImportOptions(vocab="vocab.json"))
    record = json.loads((tmp_path / "run" / IMPORT_FILE).read_text())
    assert record["source"] == str((tmp_path / "model_best.pth.tar").resolve())
    assert record["metadata"]["vocab"] == str((tmp_path / "vocab.json").resolve())
    assert record["dataset"] == "coco"
