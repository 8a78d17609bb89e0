"""Bad flags of ``bench``, ``index build``, ``report`` and ``pretrain``: one line naming the flag
(argparse's own for a malformed value), exit code 2, nothing written and no work started."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import patchword.search.index  # noqa: F401
import patchword.search.query  # noqa: F401
from conftest import TINY_WORDPIECE, one_error_line
from patchword.cli import main
from patchword.errors import ConfigError

# Imported above, before any test here replaces patchword.runs.load_run: these modules bind load_run when
# first imported, and one first imported under the replacement kept it for every later test module
# (test_faults' index builds failed with "the work started" when run after this module alone).

pytestmark = pytest.mark.usefixtures("one_thread")


def _no_work(*args, **kwargs):
    raise AssertionError("the work started")


def _argparse_error(capsys, argv: list[str]) -> str:
    """argparse's last stderr line for ``argv`` (it exits with code 2 before the command runs)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.splitlines()[-1]


@pytest.fixture(scope="module")
def tiny_run(trained_tiny_run) -> Path:
    return trained_tiny_run


# ---------------------------------------------------------------------------------------- bench two-stage


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("a,b", "argument --ks: expected an integer, got 'a'"),
        ("0", "argument --ks: must be >= 1, got 0"),
        ("16,-4", "argument --ks: must be >= 1, got -4"),
        (",", "argument --ks: expected comma-separated sizes"),
    ],
)
def test_bench_two_stage_ks_checked_at_parsing_naming_the_flag(
    tmp_path, capsys, monkeypatch, value, expected
):
    """f715cbc: ``--ks a,b`` was int()'s message without the flag; ``--ks 0`` failed after the data loaded."""
    import patchword.runs

    monkeypatch.setattr(patchword.runs, "load_run", _no_work)
    out = tmp_path / "two_stage.json"
    argv = ["bench", "two-stage", "--quick", "--run-dir", str(tmp_path), "--json", str(out), "--ks", value]
    assert expected in _argparse_error(capsys, argv)
    assert not out.exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "lots"])
def test_bench_two_stage_alpha_not_a_finite_number_is_refused_naming_the_flag(tmp_path, capsys, value):
    """f715cbc: ``--alpha nan`` ran the whole benchmark, then failed on the NaN scores of the hybrid row."""
    argv = ["bench", "all", "--quick", "--run-dir", str(tmp_path), "--stand-in-lengths", f"--alpha={value}"]
    assert "argument --alpha: expected a" in _argparse_error(capsys, argv)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [({"ks": (16, 0)}, "ks"), ({"alpha": float("nan")}, "alpha"), ({"alpha_k": 0}, "alpha_k")],
)
def test_run_two_stage_checks_its_rows_before_loading_the_run(monkeypatch, tmp_path, kwargs, key):
    import patchword.runs
    from patchword.bench.two_stage import run_two_stage

    monkeypatch.setattr(patchword.runs, "load_run", _no_work)
    with pytest.raises(ConfigError) as err:
        run_two_stage(tmp_path, **kwargs)
    assert err.value.key == key


# ------------------------------------------------------------------------------------ bench --bert-vocab

TINY_SCORING = ["bench", "scoring", "--images", "3", "--caption-images", "1", "--ref-captions", "2"]
TINY_SCORING += ["--repeats", "1", "--stand-in-lengths", "--peak-size", "64", "--no-rss", "--configs", "laps"]


@pytest.mark.parametrize("name", ["nope.txt", "missing/folder/", "./nope"])
def test_bench_scoring_bert_vocab_given_but_missing_is_refused(tmp_path, capsys, monkeypatch, name):
    """f715cbc fell back to word counts (exit 0) for a vocabulary the user named that does not exist."""
    import patchword.bench.scoring

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(patchword.bench.scoring, "run_scoring", _no_work)
    assert main([*TINY_SCORING, "--bert-vocab", name, "--json", "out.json"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: --bert-vocab: {name}: no such file or folder, nor a hub id in the offline Hugging Face cache"
    )
    assert not (tmp_path / "out.json").exists()


def test_bench_scoring_bert_vocab_that_does_not_load_names_the_flag_and_why(tmp_path, capsys, monkeypatch):
    import patchword.bench.scoring

    monkeypatch.setattr(patchword.bench.scoring, "run_scoring", _no_work)
    assert main([*TINY_SCORING, "--bert-vocab", str(tmp_path)]) == 2  # a folder without a vocabulary
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: --bert-vocab: {tmp_path}: not a BERT vocabulary that loads: ")


def test_bench_scoring_bert_vocab_given_and_found_runs(tmp_path, capsys):
    """With a shared data folder (the vocabulary counts its dense captions' tokens; with stand-in lengths it
    has nothing to count and is refused: tests/bench/test_bench_flags_up_front.py)."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(TINY_WORDPIECE) + "\n")
    data = tmp_path / "data"
    (data / "f30k_1k_test").mkdir(parents=True)
    (data / "seps_dense_llava").mkdir()
    (data / "f30k_1k_test" / "test_bert_caps.txt").write_text("101,1037,2158,102\n" * 5 * 3)
    (data / "seps_dense_llava" / "f30k_test.jsonl").write_text('{"text": "a man riding a horse."}\n' * 3)
    argv = [arg for arg in TINY_SCORING if arg != "--stand-in-lengths"]
    assert main([*argv, "--data", str(data), "--bert-vocab", str(vocab)]) == 0
    assert "| laps |" in capsys.readouterr().out


def test_bench_scoring_without_bert_vocab_keeps_the_offline_fallback(monkeypatch, capsys):
    """The default vocabulary is used where it is cached, and word counts where not: never an error (the
    lengths are read with it, once, before the benchmark runs)."""
    import patchword.bench.scoring

    seen = {}

    def capture(data, bert_vocab, **kwargs):
        seen.update(kwargs, bert_vocab=bert_vocab)
        raise ConfigError("stop", "captured")

    monkeypatch.setattr(patchword.bench.scoring, "benchmark_lengths", capture)
    monkeypatch.setattr(patchword.bench.scoring, "run_scoring", _no_work)
    assert main(TINY_SCORING) == 2
    assert one_error_line(capsys.readouterr().err) == "error: stop: captured"
    assert seen["bert_vocab"] == "bert-base-uncased"
    assert main([*TINY_SCORING, "--bert-vocab", ""]) == 2
    assert seen["bert_vocab"] is None


# ------------------------------------------------------------------------------------------- index build


def test_index_build_fp16_with_another_store_is_refused(tmp_path, capsys, monkeypatch):
    """f715cbc: ``--fp16 --store int8`` built a float16 index, exit 0."""
    import patchword.search.index

    monkeypatch.setattr(patchword.search.index, "build_index", _no_work)
    images = tmp_path / "im"
    images.mkdir()
    Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8)).save(
        images / "a.png"
    )
    out = tmp_path / "idx"
    argv = ["index", "build", str(tmp_path), "--images", str(images), "--out", str(out), "--fp16"]
    line = _argparse_error(capsys, [*argv, "--store", "int8"])
    assert line.endswith("error: argument --store: not allowed with argument --fp16")
    assert not out.exists()


# ----------------------------------------------------------------------------------------------- report


@pytest.mark.parametrize("kept", ["q_curves.png", "q_cost.png", "q.html", "q.csv"])
def test_report_refuses_to_overwrite_any_file_it_writes(tiny_run, tmp_path, capsys, kept):
    """f715cbc checked the .md and .html only: a user's q_curves.png / q_cost.png were replaced, exit 0."""
    (tmp_path / kept).write_bytes(b"mine")
    argv = ["report", str(tiny_run), "--out", str(tmp_path / "q.md"), "--csv", str(tmp_path / "q.csv")]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {tmp_path / kept} exists; pass --force")
    assert sorted(p.name for p in tmp_path.iterdir()) == [kept]
    assert (tmp_path / kept).read_bytes() == b"mine"
    pytest.importorskip("matplotlib")
    assert main([*argv, "--force"]) == 0
    assert (tmp_path / "q_curves.png").read_bytes().startswith(b"\x89PNG")


# --------------------------------------------------------------------------------------------- pretrain


@pytest.mark.parametrize("below", ["", "sub/enc"])
def test_pretrain_out_naming_a_file_is_refused_naming_the_flag(tmp_path, capsys, monkeypatch, below):
    """f715cbc: ``[Errno 20] Not a directory`` naming neither --out nor what is wrong."""
    import patchword.recipes.pretrain

    monkeypatch.setattr(patchword.recipes.pretrain, "pretrain_config", _no_work)
    blocker = tmp_path / "afile"
    blocker.write_text("mine")
    out = blocker / below if below else blocker
    assert main(["pretrain", "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    if below:
        assert line == f"error: --out: {blocker} is a file: {out} cannot be created under it"
    else:
        assert line == f"error: --out: {out} is a file: --out names the directory for the encoders"
    assert blocker.read_text() == "mine" and sorted(tmp_path.iterdir()) == [blocker]
