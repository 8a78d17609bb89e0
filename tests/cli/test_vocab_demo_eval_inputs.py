"""Bad input to ``eval``, ``export``, ``demo``, ``train`` and ``data export``: a corrupt vocabulary file,
``eval.*`` values out of range, a demo config that cannot run, synthetic-scene sizes the generator refuses.
Each ends in one ``error:`` line (exit 2) naming the file or the config key, before anything is written,
moved or prepared."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_bad_inputs import _snapshot

from conftest import TINY_RUN_32, one_error_line
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_run(trained_tiny_run) -> Path:
    return trained_tiny_run


@pytest.fixture
def run_copy(tiny_run, tmp_path) -> Path:
    """A copy of the tiny run that a test may damage."""
    return Path(shutil.copytree(tiny_run, tmp_path / "run"))


def _no_heavy_work(monkeypatch) -> None:
    """Fail the test if the data is prepared or a run is loaded: the checks must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("data prepared / run loaded before the inputs were checked")

    monkeypatch.setattr("patchword.data.prepare.prepare_data", refuse)
    monkeypatch.setattr("patchword.runs.load_run", refuse)


# -------------------------------------------------------------------------------- corrupt vocabulary files

CORRUPT_VOCABS = [
    ("truncated json", b'{"a":\n', "not valid JSON: Expecting value (line 2 column 1)"),
    ("not utf-8", b'\xff\xfe{"word2idx": {}}', "not UTF-8 text (byte 0xff at offset 0)"),
    ("json but not a vocabulary", b"[1, 2]", "not a word2idx / idx2word vocabulary json"),
    (
        "ids that are no words",
        json.dumps({"word2idx": {"7": 0}, "idx2word": {"0": 7}}).encode(),
        "idx2word[0] is 7, not a word",
    ),
    (
        "an unhashable word",
        json.dumps({"word2idx": {"a": 0}, "idx2word": {"0": ["a"]}}).encode(),
        "idx2word[0] is ['a'], not a word",
    ),
]


@pytest.mark.parametrize(("case", "content", "expected"), CORRUPT_VOCABS, ids=[c[0] for c in CORRUPT_VOCABS])
def test_corrupt_vocabulary_file_is_one_line_naming_it(run_copy, tmp_path, capsys, case, content, expected):
    """Bug: json's own message ("Expecting value: line 2 column 1 (char 6)", "'utf-8' codec can't decode
    byte 0xff") reached the user without the vocabulary file's name."""
    vocab = run_copy / "vocab.json"
    vocab.write_bytes(content)
    before = _snapshot(run_copy)
    for argv in (
        ["eval", str(run_copy), "--out", str(tmp_path / "e.json")],
        ["export", str(run_copy), str(tmp_path / "exported")],
    ):
        assert main(argv) == 2, argv
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: {vocab}: ") and expected in line, line
    assert _snapshot(run_copy) == before
    assert not (tmp_path / "e.json").exists() and not (tmp_path / "exported").exists()


def test_truncated_vocab_path_of_a_new_run_names_the_file(tiny_run, tmp_path, capsys, monkeypatch):
    """Named, and before the data is prepared (the check used to come after loading it)."""
    from patchword.train import runner

    def no_data(*args, **kwargs):
        raise AssertionError("the data was prepared before the vocabulary was checked")

    monkeypatch.setattr(runner, "load_raw_data", no_data)
    truncated = tmp_path / "vocab.json"
    truncated.write_bytes((tiny_run / "vocab.json").read_bytes()[:30])
    runs = tmp_path / "runs"
    args = [*TINY_RUN_32, "train.max_steps=1", f"data.vocab_path={truncated}", f"output_dir={runs}", "name=t"]
    assert main(["train", *args]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {truncated}: not valid JSON: Unterminated string"), line
    assert not runs.exists()


def test_vocabulary_load_errors_are_data_errors_and_a_valid_file_still_loads(tiny_run, tmp_path):
    from patchword.data.tokenizers import WordVocab
    from patchword.errors import DataError

    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"word2idx": \xc3\x28}')  # an invalid two-byte sequence at offset 13
    with pytest.raises(DataError, match=r"bad\.json: not UTF-8 text \(byte 0xc3 at offset 13\)"):
        WordVocab.load(bad)
    vocab = WordVocab.load(tiny_run / "vocab.json")
    saved = json.loads((tiny_run / "vocab.json").read_text())
    assert len(vocab) == saved["idx"] and vocab.idx2word[:4] == ["<pad>", "<start>", "<end>", "<unk>"]


# ----------------------------------------------------------------------------------------- eval.* ranges

EVAL_VALUES = [
    ("eval.batch_size=0", "eval.batch_size: must be >= 1, got 0"),
    ("eval.batch_size=-3", "eval.batch_size: must be >= 1, got -3"),
    ("eval.max_memory_mb=-1", "eval.max_memory_mb: must be >= 0, got -1"),
]
EVAL_MODES = [[], ["--suite", "compositional"], ["--suite", "patches"]]


@pytest.mark.parametrize("mode", EVAL_MODES, ids=["recall", "compositional", "patches"])
@pytest.mark.parametrize(("override", "expected"), EVAL_VALUES, ids=[v[0] for v in EVAL_VALUES])
def test_eval_range_checks_eval_keys_before_loading_anything(
    tiny_run, tmp_path, capsys, monkeypatch, mode, override, expected
):
    """Bug: eval.batch_size=0 failed in range() after the data was loaded, -3 in torch.cat, a negative
    eval.max_memory_mb without its section; the compositional suite accepted batch_size=0."""
    _no_heavy_work(monkeypatch)
    out = tmp_path / "e.json"
    before = _snapshot(tiny_run)
    assert main(["eval", str(tiny_run), *mode, "--out", str(out), override]) == 2
    assert expected in one_error_line(capsys.readouterr().err)
    assert not out.exists() and _snapshot(tiny_run) == before


def test_train_and_eval_share_the_eval_checks(tiny_run, capsys):
    """Training refuses the same values with the same words, and the lowest valid values pass."""
    import torch

    from patchword.runs import read_run_config
    from patchword.runs.checks import check_eval_settings

    cfg = read_run_config(tiny_run, ["eval.batch_size=1", "eval.max_memory_mb=0"])
    check_eval_settings(cfg, torch.device("cpu"))  # the boundaries are valid
    for override, expected in EVAL_VALUES:
        assert main(["train", *TINY_RUN_32, f"output_dir={tiny_run.parent / 'new'}", override]) == 2
        assert expected in one_error_line(capsys.readouterr().err)
    assert not (tiny_run.parent / "new").exists()


# ------------------------------------------------------------------------- options a mode does not take

SUITE_CONFLICTS = [
    (["--suite", "compositional", "--ensemble", "RUN"], "--ensemble: averages the recall of several runs"),
    (["--suite", "patches", "--ensemble", "RUN"], "--ensemble: averages the recall of several runs"),
    (
        ["--suite-file", "triples.json", "--ensemble", "RUN"],
        "--ensemble: averages the recall of several runs",
    ),
    (
        ["--suite", "patches", "--suite-file", "triples.json"],
        "--suite-file: is read by --suite compositional",
    ),
    (["--suite", "patches", "--image-root", "images"], "--image-root: is read by --suite compositional"),
    (["--image-root", "images"], "--image-root: is the directory of the --suite-file images"),
]


@pytest.mark.parametrize(
    ("options", "expected"), SUITE_CONFLICTS, ids=[" ".join(c[0]) for c in SUITE_CONFLICTS]
)
def test_eval_refuses_options_its_mode_ignores(tiny_run, tmp_path, capsys, monkeypatch, options, expected):
    """Bug: ``--suite compositional --ensemble /nonexistent/run`` exited 0 with the single model's table,
    and ``--suite patches`` ignored --suite-file / --image-root: a usage error now, before anything."""
    _no_heavy_work(monkeypatch)
    out = tmp_path / "e.json"
    options = [str(tmp_path / "missing") if o == "RUN" else o for o in options]
    assert main(["eval", str(tiny_run), *options, "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {expected}"), line
    assert not out.exists()


# ------------------------------------------------------------------------ COCO protocols on other splits


def _no_scoring(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the split was scored before the eval settings were checked against it")

    monkeypatch.setattr("patchword.eval.protocol.score_split", refuse)
    monkeypatch.setattr("patchword.eval.protocol._two_stage", refuse)


def test_coco_1k_on_a_split_that_is_not_coco_5k_is_refused_before_scoring(
    tiny_run, tmp_path, capsys, monkeypatch
):
    """Bug: eval.coco_1k=true on the 8-image test split reported coco1k_* from folds of 1, 2, 2, 1, 2
    images (a 1000-image COCO split: folds of 200), as if they were COCO 1K. Refused, naming the key and
    the COCO 5K split, before scoring; training refuses it before it writes a run."""
    _no_scoring(monkeypatch)
    out = tmp_path / "e.json"
    assert main(["eval", str(tiny_run), "--out", str(out), "eval.coco_1k=true"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: eval.coco_1k: the COCO 1K protocol averages 5 folds of 1000 images"), line
    assert "has 8 images: set data.test_split=testall" in line and not out.exists()
    runs = tmp_path / "runs"
    assert main(["train", *TINY_RUN_32, f"output_dir={runs}", "name=t", "eval.coco_1k=true"]) == 2
    assert "has 8 images: set data.test_split=testall" in one_error_line(capsys.readouterr().err)
    assert not (runs / "t").exists()


def test_coco_extended_needs_the_coco_5k_split_before_anything_is_scored(
    tiny_run, tmp_path, capsys, monkeypatch
):
    """Bug: on a split other than COCO 5K eval.coco_extended failed after the whole split was scored
    ("sims must have shape ... (1000, 25000), got (1000, 5000)") and no JSON was written. Now: synthetic
    data before anything is loaded, another split size once it is read, before scoring."""
    import torch

    from patchword.errors import ConfigError
    from patchword.runs import read_run_config
    from patchword.runs.checks import check_eval_settings, check_eval_split

    _no_heavy_work(monkeypatch)
    out = tmp_path / "e.json"
    assert main(["eval", str(tiny_run), "--out", str(out), "eval.coco_extended=true"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == "error: eval.coco_extended: needs the COCO 5K test split (ECCV Caption / CxC ids)"
    cfg = read_run_config(tiny_run, ["eval.coco_extended=true", "eval.coco_1k=true"])
    one_k = SimpleNamespace(num_images=1000, num_captions=5000)  # COCO's 1K test split
    with pytest.raises(ConfigError, match=r"eval\.coco_1k: .*has 1000 images: set data\.test_split=testall"):
        check_eval_split(cfg, one_k)
    cfg.eval.coco_1k = False
    with pytest.raises(
        ConfigError,
        match=r"eval\.coco_extended: .*1000 images and 5000 captions: set data\.test_split=testall",
    ):
        check_eval_split(cfg, one_k)
    check_eval_split(cfg, SimpleNamespace(num_images=5000, num_captions=25000))
    cfg.eval.coco_1k = True
    check_eval_split(cfg, SimpleNamespace(num_images=5000, num_captions=25000))
    cfg.eval.coco_extended = False  # eval.coco_1k alone: the settings pass before the split is read,
    check_eval_settings(cfg, torch.device("cpu"))
    with pytest.raises(ConfigError, match="eval.coco_1k"):  # the split, once read, is refused
        check_eval_split(cfg, one_k)


# --------------------------------------------------------------------------------------------------- demo


def _demo_must_not_start(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the demo prepared its data before its config was checked")

    monkeypatch.setattr("patchword.data.prepare.prepare_data", refuse)


def test_demo_checks_its_config_before_moving_the_previous_demo(tmp_path, capsys, monkeypatch):
    """Bug: the previous demo was moved aside and 12,000 scenes prepared before train.max_steps=-4 was
    refused."""
    _demo_must_not_start(monkeypatch)
    previous = tmp_path / "out" / "demo"
    previous.mkdir(parents=True)
    (previous / "summary.json").write_text("{}")
    assert main(["demo", f"output_dir={tmp_path / 'out'}", "train.max_steps=-4"]) == 2
    assert "error: train.max_steps: must be >= 0, got -4" in one_error_line(capsys.readouterr().err)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["demo"]
    assert (previous / "summary.json").read_text() == "{}"


@pytest.mark.parametrize("below", ["", "sub"], ids=["is a file", "under a file"])
def test_demo_output_dir_that_cannot_hold_a_run_names_output_dir(tmp_path, capsys, monkeypatch, below):
    """Bug: ``[Errno 20] Not a directory`` after the data was prepared, no key named."""
    _demo_must_not_start(monkeypatch)
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    output_dir = a_file / below if below else a_file
    assert main(["demo", f"output_dir={output_dir}"]) == 2
    line = one_error_line(capsys.readouterr().err)
    if below:  # named by patchword.fileio.check_output_dir, as every output directory of the CLI
        assert line == f"error: output_dir: {a_file} is a file: {output_dir} cannot be created under it"
    else:
        assert (
            line
            == f"error: output_dir: {a_file} is a file: output_dir names the directory the demo's run goes in"
        )
    assert a_file.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_demo_sets_a_previous_demo_aside_under_a_new_name_even_within_the_same_second(tmp_path, monkeypatch):
    from patchword.recipes import demo

    monkeypatch.setattr(demo.time, "strftime", lambda fmt: "20260101-000000")
    run_dir = tmp_path / "demo"
    for n in (1, 2):
        run_dir.mkdir()
        (run_dir / "n").write_text(str(n))
        demo._set_aside(run_dir)
    assert not run_dir.exists()
    assert (tmp_path / "demo-20260101-000000" / "n").read_text() == "1"
    assert (tmp_path / "demo-20260101-000000-2" / "n").read_text() == "2"


# -------------------------------------------------------------------------------- synthetic data export

EXPORT_VALUES = [
    ("data.num_test=0", "data.num_test: every split needs at least one image, got 0"),
    ("data.num_dev=-2", "data.num_dev: every split needs at least one image, got -2"),
    ("data.synthetic_image_size=0", "data.synthetic_image_size: must be >= 12"),
    ("data.dense_omit_prob=1.5", "data.dense_omit_prob: must be a probability, got 1.5"),
]


@pytest.mark.parametrize(("override", "expected"), EXPORT_VALUES, ids=[v[0] for v in EXPORT_VALUES])
def test_synthetic_export_names_the_data_key(tmp_path, capsys, override, expected):
    """Bug: "every split needs at least one image" / "image_size must be >= 12, got 0" named no key."""
    out = tmp_path / "exported"
    assert main(["data", "export", "synthetic", "--out", str(out), override]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {expected}")
    assert not out.exists()


def test_training_data_names_the_data_key(tmp_path, capsys):
    """Bug: training's own data preparation said the generator's field (``image_size: must be >= 12``), not
    the key to change (the image size check against the model passes when both are set to 8)."""
    out = tmp_path / "run"
    overrides = ["data.synthetic_image_size=8", "model.tiny_vit.image_size=8"]
    assert main(["train", f"output_dir={out}", "progress=false", "train.max_steps=1", *overrides]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: data.synthetic_image_size: must be >= 12"), line
    assert not out.exists()


def test_generator_config_errors_name_the_field_and_stay_value_errors():
    from patchword.data.synthetic import SyntheticConfig
    from patchword.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^num_test: every split needs at least one image, got 0$") as err:
        SyntheticConfig(num_test=0)
    assert err.value.key == "num_test" and isinstance(err.value, ValueError)
    with pytest.raises(ValueError, match=r"^image_size: must be >= 12"):
        SyntheticConfig(image_size=11)
    SyntheticConfig(image_size=12, num_train=1, num_dev=1, num_test=1)  # the lowest valid values
