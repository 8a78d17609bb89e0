"""A run is never lost or silently changed (issue 10): resume from the saved config, validation before
anything is written, one clear error line, eval that reads only what it scores, a SEPS recipe that runs
on a release without dev dense captions."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from conftest import TINY_MODEL_32, TINY_WORDPIECE, one_error_line
from patchword.checkpoint import load_checkpoint
from patchword.cli import main
from patchword.train.process import torch_threads

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [
    "data.num_train=20",
    "data.num_dev=12",
    "data.num_test=12",
    *TINY_MODEL_32,
    "train.batch_size=16",
    "train.log_every=1",
    "train.num_threads=1",
    "eval.max_memory_mb=16",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _args(tmp_path, cache, *extra):
    return [*TINY, f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={cache}", *extra]


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache):
    """A tiny run with non-default settings (what `--resume name=...` used to overwrite)."""
    tmp = tmp_path_factory.mktemp("trained")
    args = _args(
        tmp, cache, "name=rho06", "model.seps.sparse_ratio=0.6", "train.margin=0.3", "train.max_steps=3"
    )
    with torch_threads(1):  # as one_thread gives the tests: a module fixture runs before it
        assert main(["train", *args]) == 0
    return tmp / "runs" / "rho06"


# ------------------------------------------------------------------------------------------------ resume


def test_resume_keeps_the_saved_config_byte_for_byte_and_records_itself(trained, tmp_path):
    run = tmp_path / "rho06"
    import shutil

    shutil.copytree(trained, run)
    before = (run / "config.yaml").read_bytes()
    # The README's form: the run is found through output_dir= / name=, the rest comes from config.yaml.
    assert main(["train", "--resume", f"output_dir={tmp_path}", "name=rho06", "train.max_steps=5"]) == 0
    assert (run / "config.yaml").read_bytes() == before
    state = load_checkpoint(run / "last.pt")
    assert state["step"] == 5
    assert (
        state["config"]["model"]["seps"]["sparse_ratio"] == 0.6 and state["config"]["train"]["margin"] == 0.3
    )
    assert state["config"]["data"]["num_train"] == 20  # not the default 10000
    records = [json.loads(line) for line in (run / "resumes.jsonl").read_text().splitlines()]
    assert records == [{"time": records[0]["time"], "step": 3, "overrides": ["train.max_steps=5"]}]
    # The directory form works as well.
    assert main(["train", "--resume", str(run), "train.max_steps=6"]) == 0
    assert load_checkpoint(run / "last.pt")["step"] == 6 and (run / "config.yaml").read_bytes() == before


def test_resume_refuses_unsafe_overrides_naming_the_key(trained, capsys):
    before = _snapshot(trained)
    assert main(["train", "--resume", str(trained), "model.embed_dim=64"]) == 2
    err = capsys.readouterr().err
    assert one_error_line(err).startswith("error: model.embed_dim: cannot change on --resume")
    assert main(["train", "--resume", str(trained), "--config", "x.yaml"]) == 2
    assert _snapshot(trained) == before


def test_resume_of_a_missing_run_or_checkpoint_is_an_error(tmp_path, capsys):
    assert main(["train", "--resume", f"output_dir={tmp_path}", "name=typo_run"]) == 2
    assert "typo_run does not exist" in capsys.readouterr().err
    assert not (tmp_path / "typo_run").exists()
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.yaml").write_text("name: empty\n")
    assert main(["train", "--resume", str(tmp_path / "empty")]) == 2
    assert "has no last.pt" in capsys.readouterr().err


def test_resume_detects_an_edited_config(trained, tmp_path, capsys):
    import shutil

    run = tmp_path / "edited"
    shutil.copytree(trained, run)
    path = run / "config.yaml"
    path.write_text(path.read_text().replace("margin: 0.3", "margin: 0.5"))
    assert main(["train", "--resume", str(run), "train.max_steps=5"]) == 2
    assert "train.margin" in capsys.readouterr().err and load_checkpoint(run / "last.pt")["step"] == 3


# ------------------------------------------------------------------------------------- failed starts


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.seps.variant=papr", "model.seps.variant: must be one of code, paper, got 'papr'"),
        ("model.variant=papr", "model.seps.variant: must be one of code, paper, got 'papr'"),  # old key
        ("model.scan.direction=i2t", "model.scan.direction: has no effect with model.matcher=seps"),
        ("train.batch_size=abc", "train.batch_size: expects an integer"),
        (
            "model.tiny_vit.image_size=64",
            "data.synthetic_image_size: is 32 but model.tiny_vit.image_size is 64",
        ),
        ("data.max_caption_len=400", "data.max_caption_len: is 400 but model.max_text_len is 160"),
        ("train.init_from=nowhere.pt", "train.init_from=nowhere.pt: no such path"),
        ("model.matcher=sepz", "model.matcher: must be one of"),
    ],
)
def test_a_failed_start_leaves_nothing_and_names_the_key(tmp_path, cache, capsys, override, key):
    assert main(["train", *_args(tmp_path, cache, "name=r", override)]) == 2
    err = capsys.readouterr().err
    assert key in one_error_line(err), err
    assert not (tmp_path / "runs" / "r").exists()


def test_device_cuda_without_a_gpu_is_one_line_and_the_name_stays_free(tmp_path, cache, capsys, monkeypatch):
    """On any machine, a GPU one included: the machine without CUDA is simulated (``torch.cuda.is_available``
    says no), and the run that then takes the name trains on the CPU (``device=cpu``)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["train", *_args(tmp_path, cache, "name=r", "device=cuda", "train.max_steps=1")]) == 2
    assert "device: cuda requested but CUDA is not available" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "runs" / "r").exists()
    monkeypatch.undo()
    args = _args(tmp_path, cache, "name=r", "device=cpu", "train.max_steps=1")
    assert main(["train", *args]) == 0  # the name is free


def test_a_crash_before_the_first_checkpoint_removes_the_run(tmp_path, cache, monkeypatch):
    from patchword.train import trainer

    def boom(self, *args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(trainer.Trainer, "_train_step", boom)
    with pytest.raises(RuntimeError, match="boom"):
        main(["train", *_args(tmp_path, cache, "name=r", "train.max_steps=1")])
    assert not (tmp_path / "runs" / "r").exists()


def test_tracebacks_only_with_verbose(tmp_path, cache, capsys):
    assert main(["train", *_args(tmp_path, cache, "name=r", "model.variant=papr")]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert main(["-v", "train", *_args(tmp_path, cache, "name=r", "model.variant=papr")]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_sigterm_saves_last_pt_and_the_run_resumes(tmp_path, cache, monkeypatch, capsys):
    import os
    import signal

    from patchword.train import trainer

    original = trainer.Trainer._train_step

    def step_then_signal(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(trainer.Trainer, "_train_step", step_then_signal)
    assert main(["train", *_args(tmp_path, cache, "name=r", "train.max_steps=4")]) == 128 + signal.SIGTERM
    assert "--resume" in capsys.readouterr().err
    run = tmp_path / "runs" / "r"
    assert load_checkpoint(run / "last.pt")["step"] == 2
    monkeypatch.setattr(trainer.Trainer, "_train_step", original)
    assert main(["train", "--resume", str(run)]) == 0
    assert load_checkpoint(run / "last.pt")["step"] == 4


def test_checkpoint_every_writes_last_pt_between_validations(tmp_path, cache, monkeypatch):
    from patchword.train import trainer

    saved = []
    original = trainer.Trainer.save_last

    def record(self, averaged=False):
        saved.append(self.step)
        original(self, averaged)

    monkeypatch.setattr(trainer.Trainer, "save_last", record)
    args = _args(tmp_path, cache, "name=r", "train.max_steps=5", "train.checkpoint_every=2")
    assert main(["train", *args]) == 0
    assert saved == [2, 4, 5]  # every 2 steps, then with the final validation


# ------------------------------------------------------------------------------------------------- eval


def test_eval_writes_metadata_and_reproduces_the_trained_metrics(trained, tmp_path):
    out = tmp_path / "eval.json"
    assert main(["eval", str(trained), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    trained_metrics = json.loads((trained / "metrics.json").read_text())
    assert got["rsum"] == pytest.approx(trained_metrics["rsum"])
    assert got["split"] == "test" and got["matcher"] == "seps" and got["dense_pairing"] == "image"
    assert got["leaky"] is False and got["checkpoint"].endswith("best.pt") and len(got["config_hash"]) == 16
    assert main(["eval", str(trained), "--out", str(out)]) == 2  # exists: refused, not overwritten
    assert json.loads(out.read_text()) == got


def test_eval_checks_out_before_loading_anything(trained, tmp_path, monkeypatch, capsys):
    import patchword.runs

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(patchword.runs, "load_run", never)
    out = tmp_path / "exists.json"
    out.write_text("{}")
    assert main(["eval", str(trained), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and out.read_text() == "{}"
    assert main(["eval", str(trained), "--out", str(tmp_path / "no" / "dir.json")]) == 2
    assert main(["eval", str(trained), "--checkpoint", "nope.pt"]) == 2
    assert "nope.pt does not exist" in capsys.readouterr().err


def _laps_args(paths, *extra):
    return [
        *[a for a in TINY if not a.startswith(("data.num_", "data.synthetic_"))],  # keys of the scenes
        "data.dataset=laps",
        f"data.root={paths['root']}",
        f"data.image_root={paths['image_root']}",
        f"data.dense_train={paths['dense_train']}",
        f"data.dense_test={paths['dense_test']}",
        "data.image_size=32",
        "train.batch_size=4",
        "train.max_steps=2",
        *extra,
    ]


def test_eval_reads_only_the_split_it_scores(laps_dataset, tmp_path):
    runs = tmp_path / "runs"
    assert (
        main(["train", *_laps_args(laps_dataset, f"output_dir={runs}", "name=l", "data.dev_from_train=2")])
        == 0
    )
    # Without the training files (and the images only train uses) the test split still evaluates.
    root = laps_dataset["root"]
    (root / "train_caps.txt").unlink()
    (root / "train.jsonl").unlink()
    for i in range(8):
        (laps_dataset["image_root"] / f"train{i}.png").unlink()
    assert main(["eval", str(runs / "l"), "--out", str(tmp_path / "e.json")]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["split"] == "test"


def test_progress_is_logged_when_not_on_a_terminal(caplog):
    from patchword.progress import progress_bar

    with (
        caplog.at_level(logging.INFO, logger="patchword.progress"),
        progress_bar(4, "encode images", False, unit="image", log_every_s=0.0) as bar,
    ):
        for _ in range(4):
            bar.update(1)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("encode images: 1/4 image (25%)") and "left" in lines[0]
    assert lines[-1].startswith("encode images: 4 image in")


# --------------------------------------------------------------------------------------- real-data recipe


def test_seps_on_a_release_without_dev_dense_captions(laps_dataset, tmp_path, capsys):
    runs = tmp_path / "runs"
    args = _laps_args(laps_dataset, f"output_dir={runs}", "name=s", "model.matcher=seps")
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert "data.dense_dev" in err and "data.dev_from_train" in err and not (runs / "s").exists()
    assert main(["train", *args, "data.dev_from_train=3"]) == 0
    # the held-out images are the dev split: 3 images, their 6 captions, validated with their dense text
    dev = [json.loads(line) for line in (runs / "s" / "metrics.jsonl").read_text().splitlines()]
    assert any(r["split"] == "dev" for r in dev)


def test_dev_from_train_holds_out_images_with_their_captions_and_dense_text(laps_dataset):
    from patchword.config import apply_overrides
    from patchword.data.prepare import holdout_images, load_raw_data
    from patchword.runs.config import RunConfig

    cfg = apply_overrides(RunConfig(), _laps_args(laps_dataset, "data.dev_from_train=3"))
    full = load_raw_data(apply_overrides(cfg, ["data.dev_from_train=0"]).data, ["train"])
    raw = load_raw_data(cfg.data, ["train", "dev"])
    held = holdout_images(8, 3)
    dev, train = raw.splits["dev"], raw.splits["train"]
    assert dev.num_images == 3 and train.num_images == 5 and dev.num_captions == 6
    assert dev.images == [full.splits["train"].images[i] for i in held]
    assert dev.dense_captions == [full.splits["train"].dense_captions[i] for i in held]
    whole = full.splits["train"]
    assert dev.captions == [c for c, i in zip(whole.captions, whole.txt2img, strict=True) if i in held]
    assert sorted(dev.image_ids + train.image_ids) == sorted(full.splits["train"].image_ids)


def test_bert_size_augmentation_is_on_in_training_and_reproducible(tmp_path):
    """The official augmentation runs by default with a BERT tokenizer, seeded by (seed, step)."""

    from patchword.data.pipeline import ArrayImages, encode_split
    from patchword.data.split import RetrievalSplit
    from patchword.data.tokenizers import BertCaptionTokenizer
    from patchword.train.augment import CaptionAugmenter

    tok = BertCaptionTokenizer({w: i for i, w in enumerate(TINY_WORDPIECE)})
    import numpy as np

    words = [w for w in TINY_WORDPIECE if w.isalpha()]
    caps = [" ".join(words[i : i + 8]) for i in range(8)]
    split = RetrievalSplit("t", np.zeros((8, 4, 4, 3), np.uint8), caps, np.arange(8), dense_captions=caps)
    enc = encode_split(
        split, tok, ArrayImages(split.images), max_caption_len=20, max_dense_len=20, use_dense=True
    )
    aug = CaptionAugmenter(tok, enc, 20, 20, seed=0)
    idx = torch.arange(8)
    a = aug(idx, idx, step=3)
    assert all(torch.equal(x, y) for x, y in zip(a, aug(idx, idx, step=3), strict=True))  # reproducible
    b = aug(idx, idx, step=4)
    assert not torch.equal(a[0], b[0])  # a different step draws differently
    plain = enc.cap_ids[:, : a[0].shape[1]]
    assert not torch.equal(a[0][:, : plain.shape[1]], plain)  # and differs from the plain tokens


# --------------------------------------------------------------------------------------------- data check


def test_data_check_reports_counts_and_dense_coverage(laps_dataset, capsys):
    args = ["data", "check", *_laps_args(laps_dataset, "model.matcher=seps", "data.dev_from_train=3")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "train" in out and " 5 " in out and "10" in out and "5/5" in out and "3/3" in out and "ok" in out
    (laps_dataset["image_root"] / "test1.png").write_bytes(b"")
    assert main(args) == 2
    out = capsys.readouterr().out
    assert "test1.png: empty file" in out and "1 split(s) with problems" in out
