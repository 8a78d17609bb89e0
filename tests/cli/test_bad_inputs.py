"""Bad input, table-driven: every case ends in one ``error:`` line (exit 2) naming the file, row or config
key, and leaves everything that existed unchanged and no run directory behind."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import TINY_RUN_32, one_error_line
from patchword.cli import main

TINY_MODEL = [
    "model.name=vse-tiny-16",
    "data.max_dense_len=48",
    "train.batch_size=4",
    "train.max_steps=1",
    "train.num_threads=1",
]


def _laps_args(paths: dict[str, Path], runs: Path) -> list[str]:
    return [
        *TINY_MODEL,
        "data.dataset=laps",
        f"data.root={paths['root']}",
        f"data.image_root={paths['image_root']}",
        "data.image_size=32",
        f"output_dir={runs}",
        "name=run",
    ]


def _snapshot(*dirs: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for d in dirs if d.exists() for p in sorted(d.rglob("*")) if p.is_file()}


def _png_bytes(size: int = 32, seed: int = 1) -> bytes:
    buf = io.BytesIO()
    pixels = (np.random.default_rng(seed).random((size, size, 3)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _rewrite(path: Path, edit: Callable[[list[str]], list[str]]) -> None:
    path.write_text("\n".join(edit(path.read_text().splitlines())) + "\n")


# (case id, how to break the LAPS dataset, extra overrides, text the error must contain)
LAPS_CASES = [
    ("missing image", lambda p: (p["image_root"] / "test1.png").unlink(), [], "test1.png"),
    (  # f715cbc told a command-line user to "pass check_images=False", a library argument; then to set
        # data.check_images=false, which trained and failed at the final evaluation
        "missing image names the config key",
        lambda p: (p["image_root"] / "test1.png").unlink(),
        [],
        "test1.png: missing; replace or delete them (`patchword data check` lists them all), or set "
        "data.skip_bad_images=true",
    ),
    (
        "corrupt image",
        lambda p: (p["image_root"] / "test1.png").write_bytes(b"not an image"),
        [],
        "test1.png",
    ),
    ("empty image file", lambda p: (p["image_root"] / "dev0.png").write_bytes(b""), [], "dev0.png: empty"),
    (
        "empty caption",
        lambda p: _rewrite(p["root"] / "test_caps.txt", lambda lines: ["", *lines[1:]]),
        [],
        "test_caps.txt:1: empty caption",
    ),
    (
        "caption/id count mismatch",
        lambda p: _rewrite(p["root"] / "test_ids.txt", lambda lines: lines[:-3]),
        [],
        "test_ids.txt",
    ),
    (
        "id missing from the mapping",
        lambda p: _rewrite(p["root"] / "test_ids.txt", lambda lines: ["x9", *lines[1:]]),
        [],
        "image id 'x9'",
    ),
    (
        "dense count mismatch",
        lambda p: _rewrite(p["dense_test"], lambda lines: lines[:-1]),
        ["model.matcher=seps", "data.dev_from_train=2"],
        "test.jsonl: 3 dense captions for a split of 4 images",
    ),
    (
        "dense line not json",
        lambda p: _rewrite(p["dense_test"], lambda lines: ["{oops", *lines[1:]]),
        ["model.matcher=seps", "data.dev_from_train=2"],
        "test.jsonl:1: malformed JSON",
    ),
    (
        "missing dense file",
        lambda p: p["dense_test"].unlink(),
        ["model.matcher=seps", "data.dev_from_train=2"],
        "data.dense_test=",
    ),
    ("no dev dense captions", lambda p: None, ["model.matcher=seps"], "data.dense_dev"),
    ("unknown key", lambda p: None, ["train.lr_typo=1"], "train.lr_typo"),
    ("bad enum", lambda p: None, ["data.tokenizer=bpe"], "data.tokenizer: must be one of word, bert"),
    ("wrong type", lambda p: None, ["train.lr=fast"], "train.lr: expects a number"),
    ("image size vs encoder", lambda p: None, ["data.image_size=48"], "data.image_size: is 48"),
    ("dev_from_train too large", lambda p: None, ["data.dev_from_train=8"], "data.dev_from_train"),
]


@pytest.mark.parametrize(("case", "damage", "extra", "expected"), LAPS_CASES, ids=[c[0] for c in LAPS_CASES])
def test_bad_laps_input_is_one_line_naming_the_culprit(
    laps_dataset, tmp_path, capsys, case, damage, extra, expected
):
    paths = laps_dataset
    damage(paths)
    runs = tmp_path / "runs"
    dense = [f"data.dense_train={paths['dense_train']}", f"data.dense_test={paths['dense_test']}"]
    before = _snapshot(paths["root"])
    assert main(["train", *_laps_args(paths, runs), *dense, *extra]) == 2, case
    err = capsys.readouterr().err
    assert expected in one_error_line(err), err
    assert _snapshot(paths["root"]) == before and not (runs / "run").exists()


def test_truncated_images_fail_naming_the_file(tmp_path):
    """Never decoded as far as they go (the official loader's grey padding), whatever is cut."""
    from patchword.data.images import load_image
    from patchword.errors import DataError

    png = tmp_path / "half.png"
    png.write_bytes(_png_bytes()[:300])
    with pytest.raises(DataError, match="half.png: truncated file"):
        load_image(png)
    jpeg_bytes = io.BytesIO()
    Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8)).save(
        jpeg_bytes, format="JPEG"
    )
    jpeg = tmp_path / "half.jpg"
    jpeg.write_bytes(jpeg_bytes.getvalue()[:200])
    with pytest.raises(DataError, match="half.jpg"):
        load_image(jpeg)


# ------------------------------------------------------------------------------------ precomp (SCAN layout)


@pytest.fixture
def precomp(tmp_path):
    from patchword.data.precomp import write_precomp_split

    root = tmp_path / "precomp"
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("dev", 3), ("test", 3)):
        caps = [f"a {c} shape number {i}" for i in range(n) for c in ("red", "blue")]
        write_precomp_split(root, split, rng.random((n, 5, 7), dtype=np.float32), caps)
    return root


def _precomp_args(root: Path, runs: Path) -> list[str]:
    return [
        "data.dataset=precomp",
        f"data.root={root}",
        "data.captions_per_image=2",
        "model.image_encoder=precomp",
        "model.text_encoder=gru",
        "model.matcher=scan",
        "model.embed_dim=8",
        "model.gru.word_dim=8",
        "model.precomp.region_dim=7",
        "model.precomp.num_regions=5",
        "train.batch_size=4",
        "train.max_steps=1",
        f"output_dir={runs}",
        "name=run",
    ]


def _nan_row(root: Path, split: str, row: int) -> None:
    feats = np.load(root / f"{split}_ims.npy")
    feats[row, 1, 2] = np.nan
    np.save(root / f"{split}_ims.npy", feats)


PRECOMP_CASES = [
    ("NaN in train features", lambda r: _nan_row(r, "train", 4), [], "train_ims.npy: row 4 (image index)"),
    ("NaN in test features", lambda r: _nan_row(r, "test", 2), [], "test_ims.npy: row 2 (image index)"),
    (
        "wrong dims",
        lambda r: np.save(r / "dev_ims.npy", np.zeros((3, 35), np.float32)),
        [],
        "dev_ims.npy: expected a (N_img, R, D) array",
    ),
    ("feature width vs config", lambda r: None, ["model.precomp.region_dim=9"], "model.precomp.region_dim=9"),
    (
        "captions not a multiple of images",
        lambda r: _rewrite(r / "test_caps.txt", lambda lines: lines[:-1]),
        [],
        "test_caps.txt: 5 captions for 3 images",
    ),
]


@pytest.mark.parametrize(
    ("case", "damage", "extra", "expected"), PRECOMP_CASES, ids=[c[0] for c in PRECOMP_CASES]
)
def test_bad_precomp_input_is_one_line_naming_the_culprit(
    precomp, tmp_path, capsys, case, damage, extra, expected
):
    damage(precomp)
    runs = tmp_path / "runs"
    before = _snapshot(precomp)
    assert main(["train", *_precomp_args(precomp, runs), *extra]) == 2, case
    err = capsys.readouterr().err
    assert expected in one_error_line(err), err
    assert _snapshot(precomp) == before and not (runs / "run").exists()


# ----------------------------------------------------------------------------------------- runs and eval


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    args = [
        *TINY_MODEL,
        "data.num_train=12",
        "data.num_dev=6",
        "data.num_test=6",
        "data.synthetic_image_size=32",
        f"data.cache_dir={tmp / 'cache'}",
        f"output_dir={tmp / 'runs'}",
        "name=run",
    ]
    assert main(["train", *args]) == 0
    return tmp / "runs" / "run"


RUN_CASES = [
    ("missing run", lambda run: ["eval", str(run.parent / "nope")], "nope does not exist"),
    (
        "missing checkpoint",
        lambda run: ["eval", str(run), "--checkpoint", "gone.pt"],
        "gone.pt does not exist",
    ),
    ("not a run directory", lambda run: ["eval", str(run / "export")], "has no config.yaml"),
    ("bad eval split", lambda run: ["eval", str(run), "eval.split=val2"], "eval.split"),
    ("unknown override", lambda run: ["eval", str(run), "eval.nope=1"], "eval.nope"),
    (
        "override after a flag",  # still read (argparse alone would stop the override list at the flag)
        lambda run: ["eval", str(run), "--out", str(run.parent / "e.json"), "eval.split=val2"],
        "eval.split",
    ),
    ("architecture override", lambda run: ["eval", str(run), "model.embed_dim=24"], "do not fit the model"),
    (
        "tf32 of an engine without it",  # refused before the data is prepared
        lambda run: ["eval", str(run), "eval.precision=tf32"],
        "eval.precision: the vse scoring engine computes in fp32 only",
    ),
    (
        "unknown precision",
        lambda run: ["eval", str(run), "eval.precision=bf16"],
        "eval.precision: must be one of",
    ),
    (
        "resume missing run",
        lambda run: ["train", "--resume", str(run.parent / "nope")],
        "nope does not exist",
    ),
    ("resume unsafe key", lambda run: ["train", "--resume", str(run), "data.num_train=99"], "data.num_train"),
]


@pytest.mark.parametrize(("case", "argv", "expected"), RUN_CASES, ids=[c[0] for c in RUN_CASES])
def test_bad_run_and_eval_input(small_run, capsys, case, argv, expected):
    before = _snapshot(small_run.parent)
    assert main(argv(small_run)) == 2, case
    err = capsys.readouterr().err
    assert expected in one_error_line(err), err
    assert _snapshot(small_run.parent) == before


# ------------------------------------------------------------------------------ Hugging Face backbones


def _hf_args(laps, runs, bert, vit, *extra):
    return [
        *_laps_args(laps, runs),
        "model.text_encoder=bert",
        "data.tokenizer=bert",
        f"model.hf_text={bert}",
        f"data.bert_vocab={bert}",
        "model.image_encoder=hf",
        f"model.hf_vision={vit}",
        "data.max_caption_len=12",
        *extra,
    ]


def test_hf_backbones_checked_against_the_data_before_anything_is_written(
    laps_dataset, tmp_path, tiny_hf, capsys, monkeypatch
):
    bert, vit = tiny_hf
    runs = tmp_path / "runs"
    cases = [
        ([], "data.bert_vocab: the tokenizer has 35 ids but the text encoder"),
        (
            [f"data.bert_vocab={tmp_path / 'vocab20.txt'}", "data.max_caption_len=40"],
            "data.max_caption_len: is 40 but the text encoder has 16 positions",
        ),
        (
            [
                f"data.bert_vocab={tmp_path / 'vocab20.txt'}",
                "data.image_size=64",
                "model.tiny_vit.image_size=64",
            ],
            "data.image_size: is 64 but the image encoder",
        ),
    ]
    words = (bert / "vocab.txt").read_text().splitlines()[:20]
    (tmp_path / "vocab20.txt").write_text("\n".join(words) + "\n")
    for extra, expected in cases:
        assert main(["train", *_hf_args(laps_dataset, runs, bert, vit, *extra)]) == 2
        err = capsys.readouterr().err
        assert expected in one_error_line(err), err
        assert not runs.exists()
    # An uncached hub id offline is one line with a hint a config key can follow.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    args = _hf_args(
        laps_dataset,
        runs,
        bert,
        vit,
        "model.hf_text=not-a-user/not-a-model",
        f"data.bert_vocab={tmp_path / 'vocab20.txt'}",
    )
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert "not-a-user/not-a-model" in err and "model.hf_local_files_only" in err and "Traceback" not in err
    assert not runs.exists()
    # With a fitting vocabulary the same backbones train (and the BERT augmentation runs by default).
    ok = _hf_args(laps_dataset, runs, bert, vit, f"data.bert_vocab={tmp_path / 'vocab20.txt'}")
    assert main(["train", *ok]) == 0
    saved = json.loads((runs / "run" / "summary.json").read_text())
    assert saved["steps"] == 1
    # The run is self-contained: with the backbone directories gone, it still evaluates (its checkpoint holds
    # every weight, backbones.json the architectures).
    import shutil

    shutil.rmtree(bert)
    shutil.rmtree(vit)
    assert main(["eval", str(runs / "run"), "--out", str(tmp_path / "e.json")]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["rsum"] == pytest.approx(saved["rsum"])


def _valid_keys(section) -> str:
    import dataclasses

    return ", ".join(sorted(f.name for f in dataclasses.fields(section)))


UNKNOWN_KEY_CASES = [
    (
        "typo'd section",
        ["model.sesp.variant=paper"],
        None,
        "model.sesp: unknown config key in override 'model.sesp.variant=paper' (did you mean model.seps?); "
        "valid keys of model: {model}",
    ),
    (
        "typo'd leaf",
        ["model.seps.varient=paper"],
        None,
        "model.seps.varient: unknown config key in override 'model.seps.varient=paper' "
        "(did you mean model.seps.variant?); valid keys of model.seps: {seps}",
    ),
    (
        "top level, nothing close",
        ["zzz=1"],
        None,
        "zzz: unknown config key in override 'zzz=1'; valid keys: {top}",
    ),
    (
        "in the config file",
        [],
        "model:\n  sesp:\n    variant: paper\n",
        "model.sesp: unknown config key (did you mean model.seps?); valid keys of model: {model} (in {path})",
    ),
]


@pytest.mark.parametrize(
    ("case", "overrides", "yaml_text", "expected"), UNKNOWN_KEY_CASES, ids=[c[0] for c in UNKNOWN_KEY_CASES]
)
def test_unknown_key_lists_the_valid_keys_and_suggests_the_closest(
    tmp_path, capsys, case, overrides, yaml_text, expected
):
    """The README promised that the unknown-key message lists the valid keys; `model.sesp.variant=paper`
    only said "unknown config section"."""
    from patchword.runs.config import RunConfig

    runs = tmp_path / "runs"
    config = tmp_path / "run.yaml"
    argv = ["train", f"output_dir={runs}", *overrides]
    if yaml_text is not None:
        config.write_text(yaml_text)
        argv = ["train", "--config", str(config), *argv[1:]]
    assert main(argv) == 2, case
    cfg = RunConfig()
    keys = {"model": _valid_keys(cfg.model), "seps": _valid_keys(cfg.model.seps), "top": _valid_keys(cfg)}
    assert one_error_line(capsys.readouterr().err) == "error: " + expected.format(**keys, path=config)
    assert not runs.exists()


def test_unknown_keys_of_a_saved_config_each_get_their_closest_match():
    from patchword.config import from_dict
    from patchword.errors import ConfigError
    from patchword.runs.config import RunConfig

    with pytest.raises(ConfigError) as err:
        from_dict(RunConfig, {"trian": {}, "modle": {}, "zzz": 1})
    assert err.value.key == "modle, trian, zzz"
    assert err.value.detail == (
        "unknown config key (did you mean model for modle, train for trian?); "
        f"valid keys: {_valid_keys(RunConfig)}"
    )


# ------------------------------------------------------------------- values checked before anything runs

SYNTHETIC_TINY = [*TINY_MODEL, "data.num_train=8", "data.num_dev=4", "data.num_test=4"]

# (case, overrides, the start of the one error line); f715cbc trained with lr=nan until the first step
# failed, seeded numpy with -1 after writing the run, and took an empty name for the output directory.
VALUE_CASES = [
    # YAML's own .nan / .inf are numbers, refused by the range checks; the words nan / inf are strings,
    # which a number field takes only as a plain decimal numeral
    ("lr nan", ["train.lr=.nan"], "error: train.lr: must be a finite number > 0, got nan"),
    ("lr inf", ["train.lr=.inf"], "error: train.lr: must be a finite number > 0, got inf"),
    ("lr nan word", ["train.lr=nan"], "error: train.lr: expects a number, got 'nan'"),
    ("negative seed", ["seed=-1"], "error: seed: must lie in [0, 2**32 - 1]"),
    ("seed beyond numpy", [f"seed={2**32}"], "error: seed: must lie in [0, 2**32 - 1]"),
    ("empty name", ["name="], "error: name: is the run's directory under output_dir"),
    ("name with a slash", ["name=a/b"], "error: name: is the run's directory under output_dir"),
    ("nan anywhere", ["train.grad_clip=.nan"], "error: train.grad_clip: must be >= 0, got nan"),
    ("nan margin", ["train.margin=.NaN"], "error: train.margin: must be a finite number >= 0, got nan"),
]


@pytest.mark.parametrize(("case", "overrides", "expected"), VALUE_CASES, ids=[c[0] for c in VALUE_CASES])
def test_bad_values_are_refused_before_the_run_directory_exists(tmp_path, capsys, case, overrides, expected):
    runs = tmp_path / "runs"
    argv = ["train", *SYNTHETIC_TINY, f"output_dir={runs}", "name=run", *overrides]
    assert main(argv) == 2, case
    assert one_error_line(capsys.readouterr().err).startswith(expected)
    assert not runs.exists()


def test_wandb_online_without_an_api_key_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """f715cbc wrote the run directory, then wandb.init raised UsageError (a traceback)."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NETRC", str(tmp_path / "home" / ".netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "home" / ".config" / "wandb"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    runs = tmp_path / "runs"
    argv = ["train", *SYNTHETIC_TINY, f"output_dir={runs}", "name=run"]
    assert main([*argv, "train.report_to=[wandb]", "train.wandb_mode=online"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        "error: train.wandb_mode: online needs a W&B API"
    )
    assert not runs.exists()


def test_a_sweep_named_after_an_ordinary_run_is_refused(small_run, capsys):
    """f715cbc's `sweep --name run` over an ordinary run wrote seed directories and sweep.json into it."""
    before = _snapshot(small_run)
    argv = [
        "sweep",
        "--seeds",
        "0",
        "--name",
        small_run.name,
        *SYNTHETIC_TINY,
        f"output_dir={small_run.parent}",
    ]
    assert main(argv) == 2
    assert "is a run directory, not a sweep" in one_error_line(capsys.readouterr().err)
    assert _snapshot(small_run) == before


@pytest.mark.parametrize("verb", ["eval", "report"])
def test_out_naming_a_directory_is_refused_before_any_work(small_run, tmp_path, capsys, monkeypatch, verb):
    """f715cbc evaluated (or collected), then failed writing: ``[Errno 21] Is a directory``."""
    import patchword.experiments.report
    import patchword.runs

    def no_work(*args, **kwargs):
        raise AssertionError("the work started")

    monkeypatch.setattr(patchword.runs, "load_run", no_work)
    monkeypatch.setattr(patchword.experiments.report, "collect", no_work)
    out = tmp_path / "out"
    out.mkdir()
    argv = [verb, str(small_run), "--out", str(out)]
    assert main([*argv, "--force"]) == 2
    assert (
        one_error_line(capsys.readouterr().err)
        == f"error: --out: {out} is a directory: --out names the file to write"
    )


@pytest.mark.parametrize(
    "yaml_text",
    ["train:\n  epochs: 3\ntrain:\n  lr: 0.1\n", "train:\n  epochs: 3\n  lr: 0.1\n  epochs: 5\n"],
    ids=["section", "key"],
)
def test_a_key_given_twice_in_a_config_file_is_one_line_naming_it(tmp_path, capsys, yaml_text):
    """PyYAML keeps the last of two equal keys: a second `train:` section silently dropped the first's
    settings (epochs 3 became the default)."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml_text)
    runs = tmp_path / "runs"
    # tiny, so that a loader taking the file would train for seconds, not hours, before the assertion
    argv = ["train", "--config", str(config), *TINY_RUN_32, "train.max_steps=1", f"output_dir={runs}"]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {config}: not a ") and "given twice (first at line" in line, line
    assert not runs.exists()
