"""``index build --dense`` / ``--dense-store scores`` for matchers that never read an index's dense text.

VSE (and CLIP / FILIP / LAPS) ignore dense text, and caption-tied SEPS (``dense_pairing=caption``) pairs it
with captions, which a search query has none of: search leaves the index's dense text unread for all of
them (``Searcher.use_dense``). Their builds used to accept both flags anyway: dense tokens stored unread
(most of each image's bytes), images without a dense line skipped, dense scores written that no search
reads, and VSE's ``--dense-store scores`` refused with a reason about SEPS's paper variant. Now both flags
are refused, one line naming the flag, before anything is written, by the CLI and by the library; image-tied
SEPS still builds with them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY_RUN_32, one_error_line
from patchword.cli import main
from patchword.cli.search import main_index
from patchword.errors import ConfigError
from patchword.runs import load_run
from patchword.search.build_checks import check_dense_scores
from patchword.search.identity import model_identity
from patchword.search.index import build_index, plan_build
from patchword.search.query import Searcher, fine_matcher
from patchword.search.store import SearchIndex

pytestmark = pytest.mark.usefixtures("one_thread")

RUNS = {
    "vse": ["model.matcher=vse"],
    "laps": ["model.matcher=laps"],
    "seps_caption": ["model.matcher=seps", "model.seps.dense_pairing=caption"],
    "seps_image": ["model.matcher=seps", "model.seps.dense_pairing=image"],
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    """One-step tiny runs of :data:`RUNS` and the synthetic test split exported (8 images, dense file)."""
    root = tmp_path_factory.mktemp("dense_refusals")
    paths = {}
    for name, extra in RUNS.items():
        argv = [
            "train",
            *TINY_RUN_32,
            *extra,
            "train.max_steps=1",
            f"output_dir={root / 'runs'}",
            f"name={name}",
        ]
        assert main(argv) == 0, name
        paths[name] = root / "runs" / name
    scenes = root / "scenes"
    export = [
        "data",
        "export",
        "synthetic",
        "--split",
        "test",
        "--out",
        str(scenes),
        "--run",
        str(paths["vse"]),
    ]
    assert main(export) == 0
    paths["images"], paths["dense"] = scenes / "images", scenes / "test.jsonl"
    assert paths["dense"].is_file() and len(list(paths["images"].iterdir())) == 8
    return paths


@pytest.mark.parametrize(
    ("name", "flags", "expected"),
    [
        (
            "vse",
            ["--dense", "DENSE"],
            "error: --dense: {run}'s matcher (vse) reads no dense captions at search",
        ),
        (
            "vse",
            ["--dense-store", "scores"],
            "error: --dense-store: scores: {run}'s matcher (vse) reads no dense captions at search time",
        ),
        (  # used to be refused with a reason about SEPS's paper variant
            "vse",
            ["--dense", "DENSE", "--dense-store", "scores"],
            "error: --dense: {run}'s matcher (vse) reads no dense captions at search time (it ignores dense",
        ),
        (
            "laps",
            ["--dense", "DENSE", "--dense-store", "scores"],
            "error: --dense: {run}'s matcher (laps) reads no",
        ),
        (
            "laps",
            ["--dense-store", "scores"],
            "error: --dense-store: scores: {run}'s matcher (laps) reads no",
        ),
        (
            "seps_caption",
            ["--dense", "DENSE"],
            "error: --dense: {run}'s matcher (seps) reads no dense captions at search time "
            "(dense_pairing=caption ties its dense text to captions",
        ),
        (
            "seps_caption",
            ["--dense", "DENSE", "--dense-store", "scores"],
            "error: --dense: {run}'s matcher (seps) reads no dense captions at search time",
        ),
    ],
)
def test_cli_refuses_dense_text_the_matcher_never_reads(setup, tmp_path, capsys, name, flags, expected):
    """Exit code 2, one line naming the flag and the run's matcher, ``--out`` never created."""
    out = tmp_path / "idx"
    flags = [str(setup["dense"]) if flag == "DENSE" else flag for flag in flags]
    argv = ["build", str(setup[name]), "--images", str(setup["images"]), "--out", str(out), *flags]
    assert main_index(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(expected.format(run=setup[name])), line
    assert not out.exists()


@pytest.mark.parametrize("name", ["vse", "laps", "seps_caption"])
def test_library_refuses_too_and_the_build_without_dense_works(setup, tmp_path, name):
    """``build_index`` / ``plan_build`` (what ``index build`` calls) raise the same ConfigError; the same
    build without the flags indexes every image."""
    run = load_run(setup[name])
    out = tmp_path / "idx"
    for call in (build_index, plan_build):
        with pytest.raises(ConfigError, match="reads no dense captions at search time") as err:
            call(run, setup["images"], out, dense=setup["dense"])
        assert err.value.key == "--dense"
        with pytest.raises(ConfigError, match="reads no dense captions at search time") as err:
            call(run, setup["images"], out, dense_store="scores")
        assert err.value.key == "--dense-store"
        assert not out.exists()
    report = build_index(run, setup["images"], out)
    assert report.num_images == 8 and report.skipped == []
    assert not list((out / "shards").glob("*dense*"))


def test_check_dense_scores_names_the_real_reason_for_a_matcher_without_dense_text(setup):
    """The per-image-score probe used to answer, for VSE, that 'its dense text enters every pair's
    selection, as in SEPS's paper variant'; VSE has no dense text at all."""
    run = load_run(setup["vse"])
    fine = fine_matcher(run.model.matcher)
    with pytest.raises(ConfigError) as err:
        check_dense_scores(None, model_identity(run), run, fine)  # refused before any engine probe
    assert err.value.key == "--dense-store"
    assert "reads no dense captions at search time (it ignores dense text)" in str(err.value)
    assert "paper variant" not in str(err.value)


def test_image_tied_seps_keeps_dense_tokens_and_scores_and_search_reads_them(setup, tmp_path):
    """Where search reads the index's dense text, ``--dense`` (tokens, or ``--dense-store scores``) builds
    as before."""
    run = load_run(setup["seps_image"])
    for store in ("tokens", "scores"):
        out = tmp_path / store
        report = build_index(run, setup["images"], out, dense=setup["dense"], dense_store=store)
        assert report.num_images == 8
        index = SearchIndex.open(out)
        assert index.has_dense and index.dense_store == store
        suffix = "dense.npy" if store == "tokens" else "dense_score.npy"
        assert np.load(out / "shards" / f"00000.{suffix}").shape[0] == 8
        assert Searcher(index, run).use_dense


def test_caption_tied_seps_without_dense_is_not_warned_about_dense_it_would_never_read(
    setup, tmp_path, caplog
):
    """A caption-tied SEPS trained with dense captions: the build without ``--dense`` used to warn that
    the fine stage would score without them 'which is not how the model was evaluated' (search reads
    none whatever the index holds); image-tied SEPS is still warned."""
    with caplog.at_level(logging.WARNING, logger="patchword.search.index"):
        build_index(load_run(setup["seps_caption"]), setup["images"], tmp_path / "caption")
    assert not [r for r in caplog.records if "no --dense file was given" in r.getMessage()]
    with caplog.at_level(logging.WARNING, logger="patchword.search.index"):
        build_index(load_run(setup["seps_image"]), setup["images"], tmp_path / "image")
    assert [r for r in caplog.records if "no --dense file was given" in r.getMessage()]
