"""``patchword bench``: flags that could not work are refused before any benchmark runs, and flags that were
silently dropped are honoured (2e0a019):

* a checkpoint that does not load (a text file, another run's weights) or a FAISS backend without FAISS was
  found after ``bench all``'s whole scoring part (FAISS: a traceback, exit 1);
* ``--two-stage-repeats`` was overridden by ``--quick``; ``--configs laps,laps`` scored laps twice and kept
  one; ``--bert-vocab`` with stand-in lengths was loaded, then ignored;
* the RSS probe ran with torch's default threads, not ``--threads``;
* the fallback to word counts advised a training key (``model.hf_local_files_only``) bench does not take.
"""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch

from conftest import one_error_line
from patchword.cli.bench import main

TINY = ["--images", "2", "--caption-images", "1", "--ref-captions", "1", "--repeats", "1"]
TINY += ["--peak-size", "64", "--configs", "laps", "--stand-in-lengths", "--no-rss", "--bert-vocab", ""]


@pytest.fixture
def no_benchmark(monkeypatch):
    """Either benchmark fails the test if it starts (the run itself may load: that is a check now)."""
    import patchword.bench.scoring
    import patchword.bench.two_stage

    def work(*args, **kwargs):
        raise AssertionError("a benchmark started")

    monkeypatch.setattr(patchword.bench.scoring, "run_scoring", work)
    monkeypatch.setattr(patchword.bench.two_stage, "run_two_stage", work)


def _error(capsys) -> str:
    return one_error_line(capsys.readouterr().err)


def test_a_checkpoint_that_is_no_checkpoint_is_refused_before_the_scoring(
    trained_tiny_run, tmp_path, capsys, no_benchmark
):
    text = tmp_path / "notes.pt"
    text.write_text("not weights\n")
    argv = ["all", *TINY, "--run-dir", str(trained_tiny_run), "--checkpoint", str(text)]
    assert main(argv) == 2
    line = _error(capsys)
    assert line.startswith(f"error: --checkpoint: {text}: ") and "not a PyTorch file" in line, line


def test_another_runs_checkpoint_is_refused_before_the_scoring(
    trained_tiny_run, trained_region_run, capsys, no_benchmark
):
    other = trained_region_run / "best.pt"
    assert main(["all", *TINY, "--run-dir", str(trained_tiny_run), "--checkpoint", str(other)]) == 2
    line = _error(capsys)
    assert line.startswith(f"error: --checkpoint: the weights in {other} do not fit the model"), line


@pytest.mark.parametrize("verb", ["two-stage", "all"])
@pytest.mark.parametrize("backend", ["faiss_flat", "faiss_ivf", "faiss_hnsw"])
def test_a_faiss_backend_without_faiss_is_one_line_before_any_work(
    trained_tiny_run, capsys, monkeypatch, no_benchmark, verb, backend
):
    import patchword.runs

    def no_load(*args, **kwargs):
        raise AssertionError("the run was loaded")

    monkeypatch.setattr(patchword.runs, "load_run", no_load)
    monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` raises ImportError
    flags = TINY if verb == "all" else ["--quick"]
    assert main([verb, *flags, "--run-dir", str(trained_tiny_run), "--backend", backend]) == 2
    assert _error(capsys) == (
        f"error: --backend {backend} needs the faiss package: pip install 'patchword[ann]' "
        "(or --backend exact)"
    )


def test_an_explicit_two_stage_repeats_wins_over_quick_and_is_recorded(trained_tiny_run, tmp_path, capsys):
    out = tmp_path / "two_stage.json"
    argv = ["two-stage", "--run-dir", str(trained_tiny_run), "--ks", "4", "--alpha", "0", "--quick"]
    assert main([*argv, "--two-stage-repeats", "3", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["two_stage"]["repeats"] == 3
    assert main([*argv, "--json", str(out), "--force"]) == 0  # --quick alone: one repeat
    assert json.loads(out.read_text())["two_stage"]["repeats"] == 1
    capsys.readouterr()


def test_a_config_given_twice_is_refused(capsys, no_benchmark):
    argv = [arg if arg != "laps" else "laps,seps-code-image,laps" for arg in ["scoring", *TINY]]
    assert main(argv) == 2
    assert _error(capsys) == "error: --configs: laps is given twice: each config is scored once"


@pytest.mark.parametrize("lengths", ["stand-in", "no data folder"])
def test_a_bert_vocabulary_with_nothing_to_count_is_refused(
    tmp_path, capsys, monkeypatch, no_benchmark, lengths
):
    import patchword.bench.inputs
    import patchword.bench.scoring
    from conftest import TINY_WORDPIECE

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(TINY_WORDPIECE) + "\n")
    argv = ["scoring", *[arg for arg in TINY if arg not in ("--bert-vocab", "")], "--bert-vocab", str(vocab)]
    if lengths == "stand-in":
        why = "--stand-in-lengths takes seeded stand-in lengths"
    else:
        for module in (patchword.bench.inputs, patchword.bench.scoring):
            monkeypatch.setattr(module, "find_shared_data", lambda path=None: None, raising=False)
        argv.remove("--stand-in-lengths")
        why = "no shared data folder was found (../shared/data; --data names one): stand-in lengths are used"
    assert main(argv) == 2
    assert _error(capsys) == (
        f"error: --bert-vocab: counts the tokens of the shared data folder's dense captions, but {why}: it "
        "would change nothing; drop it"
    )


def test_the_rss_probe_runs_with_the_runs_threads(monkeypatch, capsys):
    import patchword.bench.memory
    import patchword.bench.scoring
    from patchword.cli.bench import _parser

    calls = []
    monkeypatch.setattr(
        patchword.bench.scoring, "measure_rss_in_subprocess", lambda c: calls.append(c) or 1.0
    )
    argv = [arg for arg in TINY if arg != "--no-rss"]
    assert main(["scoring", *argv, "--threads", "2"]) == 0
    (call,) = calls
    assert call.threads == 2 and _parser().parse_args(call.probe_argv()).threads == 2
    # the probe's process sets them for its measured call (and gives the caller's back)
    seen, reset = [], patchword.bench.memory._reset_peak_rss

    def noting():  # the peak mark is reset just before the measured call
        seen.append(torch.get_num_threads())
        reset()

    monkeypatch.setattr(patchword.bench.memory, "_reset_peak_rss", noting)
    before = torch.get_num_threads()
    capsys.readouterr()
    assert main(call.probe_argv()) == 0
    assert "rss_growth_mb" in json.loads(capsys.readouterr().out)
    assert seen == [2] and torch.get_num_threads() == before


def test_the_word_count_fallback_names_the_flag_not_a_training_key(tmp_path, monkeypatch, caplog):
    from patchword.bench.inputs import real_lengths
    from patchword.data.tokenizers import BertCaptionTokenizer
    from patchword.errors import ModelNotFoundError

    def offline(name, *args, **kwargs):
        raise ModelNotFoundError(f"{name} is not in the offline cache; set model.hf_local_files_only=false")

    monkeypatch.setattr(BertCaptionTokenizer, "from_pretrained", offline)
    data = tmp_path / "data"
    (data / "f30k_1k_test").mkdir(parents=True)
    (data / "seps_dense_llava").mkdir()
    (data / "f30k_1k_test" / "test_bert_caps.txt").write_text("101,1037,102\n" * 5)
    (data / "seps_dense_llava" / "f30k_test.jsonl").write_text('{"text": "a red circle."}\n')
    with caplog.at_level(logging.INFO, logger="patchword.bench.inputs"):
        _, dense, source = real_lengths(data, "bert-base-uncased")
    assert dense.tolist() == [6] and "words + punctuation" in source
    shown = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(shown) == 1 and "--bert-vocab" in shown[0] and "hf_local_files_only" not in shown[0], shown
