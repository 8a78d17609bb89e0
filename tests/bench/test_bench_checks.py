"""``patchword bench``: every flag is checked before any benchmark runs, as one error line naming the flag
(exit code 2): result files that cannot be written, a run directory or checkpoint that is not there, sizes
beyond the lengths the inputs have, a budget that is not a finite number > 0."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from conftest import one_error_line
from patchword.cli.bench import main
from patchword.errors import ConfigError

TINY = ["--images", "2", "--caption-images", "1", "--ref-captions", "1", "--repeats", "1"]
TINY += ["--peak-size", "64", "--configs", "laps", "--stand-in-lengths", "--no-rss", "--bert-vocab", ""]
# Each verb with the flags it needs to get past its own checks (RUN: a run directory with a checkpoint).
VERBS = {
    "scoring": ["scoring", *TINY],
    "two-stage": ["two-stage", "--run-dir", "RUN", "--quick"],
    "all": ["all", *TINY, "--run-dir", "RUN"],
    "gallery": ["gallery", "--quick"],
}


@pytest.fixture
def no_work(monkeypatch):
    """Every benchmark (and every load of a run) fails the test if it starts."""
    import patchword.bench.gallery
    import patchword.bench.scoring
    import patchword.bench.two_stage
    import patchword.runs

    def work(*args, **kwargs):
        raise AssertionError("a benchmark started")

    monkeypatch.setattr(patchword.bench.scoring, "run_scoring", work)
    monkeypatch.setattr(patchword.bench.two_stage, "run_two_stage", work)
    monkeypatch.setattr(patchword.bench.gallery, "build_bench_matcher", work)
    monkeypatch.setattr(patchword.runs, "load_run", work)


def _run_dir(tmp_path: Path) -> Path:
    """What the checks of --run-dir look at: a config.yaml and a best.pt (never loaded here)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: run\n")
    (run / "best.pt").write_bytes(b"")
    return run


def _argv(verb: str, tmp_path: Path, *flags: str) -> list[str]:
    run = str(_run_dir(tmp_path))
    return [run if arg == "RUN" else arg for arg in VERBS[verb]] + list(flags)


def _error(capsys) -> str:
    return one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("verb", list(VERBS))
@pytest.mark.parametrize("force", [[], ["--force"]])
def test_json_naming_a_directory_is_refused_before_the_run(tmp_path, capsys, no_work, verb, force):
    """f715cbc: ``--json DIR --force`` failed after the run with an errno message, and without --force
    advised ``exists; pass --force``, which would not have helped."""
    folder = tmp_path / "results"
    folder.mkdir()
    assert main(_argv(verb, tmp_path, "--json", str(folder), *force)) == 2
    assert _error(capsys) == f"error: --json: {folder} is a directory: --json names the file to write"


@pytest.mark.parametrize("verb", list(VERBS))
def test_json_below_a_file_is_refused_before_the_run(tmp_path, capsys, no_work, verb):
    blocker = tmp_path / "file.json"
    blocker.write_text("mine")
    assert main(_argv(verb, tmp_path, "--json", str(blocker / "x.json"))) == 2
    assert _error(capsys) == f"error: --json: directory {blocker} is a file"
    assert blocker.read_text() == "mine"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("verb", list(VERBS))
def test_json_in_a_folder_that_takes_no_files_is_refused_before_the_run(tmp_path, capsys, no_work, verb):
    assert main(_argv(verb, tmp_path, "--json", "/proc/x.json")) == 2
    assert _error(capsys).startswith("error: --json: /proc/x.json cannot be written: /proc: ")


@pytest.mark.parametrize("verb", ["two-stage", "all"])
def test_a_missing_run_dir_or_checkpoint_is_refused_before_the_run(tmp_path, capsys, no_work, verb):
    """f715cbc: ``bench all --run-dir /nonexistent`` ran the whole scoring part, then said the run directory
    does not exist."""
    missing = tmp_path / "nonexistent"
    argv = _argv(verb, tmp_path)
    run = argv[argv.index("--run-dir") + 1]
    argv[argv.index("--run-dir") + 1] = str(missing)
    assert main(argv) == 2
    assert _error(capsys) == f"error: --run-dir: run directory {missing} does not exist"
    argv[argv.index("--run-dir") + 1] = run
    assert main([*argv, "--checkpoint", "missing.pt"]) == 2
    line = _error(capsys)
    assert (
        line == f"error: --checkpoint: checkpoint missing.pt does not exist: {run} has best.pt "
        "(pass checkpoint= / --checkpoint)"
    )


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        # 5 captions scored: 7 would score one caption 7 times while reporting 7
        (
            ["--ref-captions", "7"],
            "error: --ref-captions: at most 5, the captions scored (5 each of 1 image(s): "
            "--caption-images 1, --images 2), got 7",
        ),
        # dense lengths exist for the 1000 Flickr30K test images: `dense_lens must have shape (1001,)`
        (
            ["--images", "1001", "--configs", "seps-code-image"],
            "error: --images: at most 1000 with dense text (seps-code-image): the lengths of the dense "
            "captions of 1000 images are known, got 1001",
        ),
        (
            ["--images", "1001", "--caption-images", "1001"],
            "error: --caption-images: at most 1000: the caption lengths of 1000 images are known, got 1001",
        ),
        (["--configs", ""], "error: --configs: no scoring config given; choose from "),
    ],
)
@pytest.mark.parametrize("verb", ["scoring", "all"])
def test_scoring_sizes_beyond_the_inputs_are_refused_naming_the_flag(
    tmp_path, capsys, no_work, verb, flags, expected
):
    assert main(_argv(verb, tmp_path, *flags)) == 2
    assert _error(capsys).startswith(expected)


def _shared_data(root: Path, images: int) -> Path:
    """A shared data folder as the scoring benchmark reads it: the BERT ids of 5 captions per image and one
    dense caption per image."""
    (root / "f30k_1k_test").mkdir(parents=True)
    (root / "seps_dense_llava").mkdir()
    (root / "f30k_1k_test" / "test_bert_caps.txt").write_text("101,1037,2158,102\n" * 5 * images)
    dense = '{"text": "a man riding a horse, the dog is running."}\n'
    (root / "seps_dense_llava" / "f30k_test.jsonl").write_text(dense * images)
    return root


@pytest.mark.parametrize("verb", ["scoring", "all"])
def test_a_data_folder_of_fewer_images_is_refused_before_the_benchmark_naming_the_flag(
    tmp_path, capsys, no_work, verb
):
    """The command checked its sizes against the Flickr30K test's 1000 images, and the benchmark checked
    them again against the data folder's once it had started, naming its argument (``images: at most
    3``). The lengths are read, and the sizes checked against them, before any benchmark runs."""
    data = _shared_data(tmp_path / "data", images=3)
    argv = [arg for arg in _argv(verb, tmp_path, "--data", str(data)) if arg != "--stand-in-lengths"]
    assert main([*argv, "--images", "4", "--configs", "seps-code-image"]) == 2
    assert _error(capsys) == (
        "error: --images: at most 3 with dense text (seps-code-image): the lengths of the dense captions of "
        "3 images are known, got 4"
    )


def test_one_command_loads_the_vocabulary_and_checks_the_plan_once(tmp_path, capsys, monkeypatch):
    """``bench scoring --bert-vocab V`` loaded V to check it and again for the dense lengths, and checked
    its sizes three times (the command, the benchmark, the benchmark with the lengths found)."""
    import patchword.bench.scoring
    from conftest import TINY_WORDPIECE
    from patchword.data.tokenizers import BertCaptionTokenizer

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(TINY_WORDPIECE) + "\n")
    loads, checks = [], []
    load, check = BertCaptionTokenizer.from_pretrained, patchword.bench.scoring.check_scoring_plan
    monkeypatch.setattr(
        BertCaptionTokenizer, "from_pretrained", lambda *a, **k: loads.append(a) or load(*a, **k)
    )
    monkeypatch.setattr(
        patchword.bench.scoring, "check_scoring_plan", lambda **k: checks.append(k) or check(**k)
    )

    def stop(*args, **kwargs):  # the lengths are read: nothing more is needed
        raise ConfigError("stop", "the inputs are made")

    monkeypatch.setattr(patchword.bench.scoring, "scoring_inputs", stop)
    data = _shared_data(tmp_path / "data", images=1000)
    argv = [arg for arg in VERBS["scoring"] if arg not in ("--stand-in-lengths", "--bert-vocab", "")]
    assert main([*argv, "--data", str(data), "--bert-vocab", str(vocab)]) == 2
    assert _error(capsys) == "error: stop: the inputs are made"
    assert loads == [(str(vocab),)] and len(checks) == 1


def test_the_limit_on_images_is_that_of_dense_text():
    """LAPS reads no dense text: more images than have dense lengths still score (their captions' lengths
    are those of the first ones)."""
    from patchword.bench.scoring import check_scoring_plan

    plan = {"caption_images": 2, "ref_captions": 10, "max_memory_mb": 64.0}
    assert check_scoring_plan(images=1001, configs=["laps"], **plan) == 10
    with pytest.raises(ConfigError) as err:
        check_scoring_plan(images=1001, configs=["laps", "seps-code-caption"], **plan)
    assert err.value.key == "images"


@pytest.mark.parametrize("verb", list(VERBS))
@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_max_memory_mb_not_a_finite_number_above_zero_is_an_argparse_error(tmp_path, capsys, verb, value):
    """f715cbc: ``--max-memory-mb nan`` gave ``cannot convert float NaN to integer`` (for two-stage after the
    run and its data were loaded)."""
    with pytest.raises(SystemExit) as exit_:
        main(_argv(verb, tmp_path, "--max-memory-mb", value))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error: argument --max-memory-mb: " in err.splitlines()[-1]


def test_the_library_checks_sizes_and_budget_before_any_work(monkeypatch, tmp_path):
    import patchword.bench.scoring
    import patchword.runs
    from patchword.bench import run_scoring, run_two_stage

    def work(*args, **kwargs):
        raise AssertionError("work started")

    monkeypatch.setattr(patchword.bench.scoring, "benchmark_lengths", work)
    monkeypatch.setattr(patchword.runs, "load_run", work)
    with pytest.raises(ConfigError) as err:
        run_scoring(images=2, caption_images=1, ref_captions=6, stand_in_lengths=True)
    assert err.value.key == "ref_captions"
    with pytest.raises(ConfigError) as err:
        run_scoring(images=2, caption_images=1, ref_captions=1, max_memory_mb=math.nan)
    assert err.value.key == "max_memory_mb"
    with pytest.raises(ConfigError) as err:
        run_two_stage(tmp_path, max_memory_mb=math.nan)
    assert err.value.key == "max_memory_mb"


def test_json_dash_is_stdout_and_the_tables_go_to_stderr(tmp_path, monkeypatch, capsys):
    """Old code: ``--json -`` wrote a file named ``-`` in the working directory and printed the table to
    stdout, so ``| jq`` read a table."""
    import json

    monkeypatch.chdir(tmp_path)
    assert main(["scoring", *TINY, "--threads", "1", "--json", "-"]) == 0
    printed = capsys.readouterr()
    results = json.loads(printed.out)
    assert results["command"].startswith("patchword bench scoring") and "scoring" in results
    assert "engine" in printed.err and not (tmp_path / "-").exists()
