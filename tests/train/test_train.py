"""Trainer, run directory, resume, and the in-process CLI smoke test on tiny synthetic data."""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY_MODEL_32
from patchword.checkpoint import load_checkpoint
from patchword.cli import main
from patchword.config import apply_overrides, load_config
from patchword.data.prepare import prepare_data
from patchword.runs.config import RunConfig
from patchword.train import trainer
from patchword.train.runner import resume_run, train_run
from project_paths import ROOT

TINY = [
    "data.num_train=20",
    "data.num_dev=12",
    "data.num_test=12",
    *TINY_MODEL_32,
    "train.batch_size=16",
    "train.lr=1e-3",
    "train.log_every=1",
    "eval.max_memory_mb=1",
]


def _cfg(tmp_path, *extra):
    return apply_overrides(
        RunConfig(), [f"output_dir={tmp_path}", f"data.cache_dir={tmp_path / 'cache'}", *TINY, *extra]
    )


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    cfg = _cfg(tmp_path_factory.mktemp("data"))
    return prepare_data(cfg.data)


def test_run_writes_everything_and_refuses_to_overwrite(tmp_path, tiny_data):
    cfg = _cfg(tmp_path, "name=r", "train.epochs=1")
    summary = train_run(cfg, data=tiny_data)
    run = tmp_path / "r"
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
        "metrics.json",
        "last.pt",
        "best.pt",
        "vocab.json",
    ):
        assert (run / name).is_file(), name
    assert (run / "export" / "model.safetensors").is_file() and (run / "export" / "config.json").is_file()
    for key in ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum", "oracle_rsum"):
        assert key in summary
    assert 0 <= summary["rsum"] <= 600 and summary["oracle_rsum"] > 300
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["split"] for r in records} == {"train", "dev"}
    # the resolved config round-trips
    assert load_config(RunConfig, run / "config.yaml") == cfg
    with pytest.raises(FileExistsError, match="already exists"):
        train_run(cfg, data=tiny_data)


def test_resume_reproduces_an_uninterrupted_run(tmp_path, tiny_data):
    full = _cfg(tmp_path, "name=full", "train.epochs=2", "train.global_warmup_steps=2")
    train_run(full, data=tiny_data)
    # the same run interrupted after 4 steps (mid-epoch), then resumed to the end
    part = _cfg(tmp_path, "name=part", "train.epochs=2", "train.global_warmup_steps=2", "train.max_steps=4")
    train_run(part, data=tiny_data)
    interrupted = load_checkpoint(tmp_path / "part" / "last.pt")
    assert interrupted["step"] == 4 and interrupted["epoch"] == 0 and interrupted["batch_in_epoch"] == 4
    resume_run(tmp_path / "part", ["train.max_steps=0"])  # the rest comes from the run's config.yaml
    a = load_checkpoint(tmp_path / "full" / "last.pt")
    b = load_checkpoint(tmp_path / "part" / "last.pt")
    assert a["step"] == b["step"] == 14
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key  # the same arithmetic: bit for bit
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    assert a["scheduler"] == b["scheduler"]


def test_non_finite_loss_skips_the_step(tmp_path, tiny_data, monkeypatch, caplog):
    from patchword.losses import HingeLoss

    calls = {"n": 0}
    original = HingeLoss.forward

    def sometimes_nan(self, *args, **kwargs):
        calls["n"] += 1
        out = original(self, *args, **kwargs)
        return out * float("nan") if calls["n"] == 2 else out

    monkeypatch.setattr(HingeLoss, "forward", sometimes_nan)
    cfg = _cfg(tmp_path, "name=nan", "train.epochs=1", "train.global_warmup_steps=100")
    summary = train_run(cfg, data=tiny_data)
    assert summary["skipped_steps"] == 1
    assert "non-finite loss" in caplog.text


def test_warm_start_copies_encoders_into_a_new_matcher(tmp_path, tiny_data):
    from patchword.checkpoint import warm_start
    from patchword.model import build_model

    source = _cfg(tmp_path, "name=glob", "model.matcher=vse", "train.max_steps=3")
    train_run(source, data=tiny_data)
    fine = _cfg(
        tmp_path, "name=fine", "model.matcher=seps", f"train.init_from={tmp_path / 'glob' / 'last.pt'}"
    )
    model = build_model(fine.model, vocab_size=tiny_data.vocab_size)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = warm_start(model, tmp_path / "glob" / "export")  # export dir: same weights as last.pt's
    trained = load_checkpoint(tmp_path / "glob" / "last.pt")["model"]
    assert report["loaded"] and all(
        k.startswith(("image_encoder.", "text_encoder.")) for k in report["loaded"]
    )
    for key in report["loaded"]:
        assert torch.equal(model.state_dict()[key], trained[key]), key
    # the SEPS head is not in the VSE checkpoint: it keeps its initialisation
    assert report["missing"] and all(k.startswith("matcher.") for k in report["missing"])
    for key in report["missing"]:
        assert torch.equal(model.state_dict()[key], before[key]), key
    # through the config, before training starts
    summary = train_run(
        _cfg(
            tmp_path,
            "name=fine",
            "model.matcher=seps",
            "train.max_steps=1",
            f"train.init_from={tmp_path / 'glob' / 'last.pt'}",
        ),
        data=tiny_data,
    )
    assert "rsum" in summary
    with pytest.raises(FileNotFoundError, match="no weights"):
        warm_start(model, tmp_path / "nowhere.pt")


def test_dense_text_is_encoded_only_for_matchers_that_read_it(tiny_data, monkeypatch):
    from patchword.model import build_model

    train = tiny_data.splits["train"]
    idx = torch.arange(4)
    images = train.images.batch(train.txt2img[idx], train=False)
    lens = train.cap_lens[idx]
    ids = train.cap_ids[idx, : int(lens.max())]
    dense_lens = train.dense_lens[train.txt2img[idx]]
    dense_ids = train.dense_ids[train.txt2img[idx], : int(dense_lens.max())]
    cfg = _cfg(Path("."))
    for matcher, variant, reads in (
        ("seps", "paper", True),
        ("laps", "code", False),
        ("vse", "code", False),
    ):
        model = build_model(
            replace(cfg.model, matcher=matcher, seps=replace(cfg.model.seps, variant=variant)),
            vocab_size=tiny_data.vocab_size,
        )
        assert model.matcher.consumes_dense is reads
        calls = []
        original = model.encode_texts
        monkeypatch.setattr(
            model, "encode_texts", lambda i, n, _o=original, _c=calls: _c.append(i.shape) or _o(i, n)
        )
        model(images, ids, lens, dense_ids, dense_lens)
        assert len(calls) == (2 if reads else 1), matcher


def test_step_milestones_decay_the_learning_rate(tmp_path, tiny_data):
    cfg = _cfg(tmp_path, "name=lr", "train.max_steps=3", "train.lr_milestone_steps=[2]", "train.lr_decay=0.5")
    train_run(cfg, data=tiny_data)
    groups = load_checkpoint(tmp_path / "lr" / "last.pt")["optimizer"]["param_groups"]
    assert [g["lr"] for g in groups] == pytest.approx([1e-3 * 0.5] * len(groups))
    records = [json.loads(line) for line in (tmp_path / "lr" / "metrics.jsonl").read_text().splitlines()]
    lrs = {r["step"]: r["lr"] for r in records if r["split"] == "train"}
    assert lrs[1] == pytest.approx(1e-3) and lrs[3] == pytest.approx(5e-4)  # steps done: 1 and 3


def test_hardest_negatives_start_at_hardest_after_epochs(tmp_path, tiny_data, monkeypatch):
    """``train.hardest_after_epochs=1``: epoch 0 sums the negatives, epoch 1 (the first epoch, counted from
    0, not before the switch) mines the hardest, every step of it."""
    from patchword.model import build_model
    from patchword.train.step_modules import StepModules
    from patchword.train.trainer import Trainer

    seen = []
    original = StepModules.run

    def recording(self, batch, hardest, *args, **kwargs):
        seen.append(hardest)
        return original(self, batch, hardest, *args, **kwargs)

    monkeypatch.setattr(StepModules, "run", recording)
    monkeypatch.setattr(Trainer, "validate", lambda self, flag: {})  # the steps are what is checked
    train = tiny_data.splits["train"].first_images(4)  # two steps an epoch, of half its captions each
    cfg = _cfg(
        tmp_path,
        "train.epochs=2",
        "train.hardest_after_epochs=1",
        f"train.batch_size={train.num_captions // 2}",
    )
    model = build_model(cfg.model, vocab_size=tiny_data.vocab_size)
    Trainer(cfg, model, train, tiny_data.splits["dev"], tmp_path).fit()
    assert seen == [False, False, True, True]


def test_false_negative_mask_comes_from_the_dataset(tiny_data):
    """A batch's ``ignore`` is the split's ``fits(captions, images)`` relation, rows images and columns
    captions as the losses read it (``ignore[i, j]``: caption j fits image i, so it is no negative of i)."""
    from patchword.data.batches import ShardedBatches

    train = tiny_data.splits["train"]
    caps = torch.arange(10)
    fits = train.fits(caps.numpy(), train.txt2img[caps].numpy())
    assert fits.diagonal().all()  # every caption fits its own image
    # An asymmetric relation (the tiny data's is exactly "same image": symmetric in a batch, it masks only
    # what img_ids does and tells no orientation apart): caption c fits image i where (3 c + i) % 4 == 0,
    # and its own image.
    c, i = np.arange(train.num_captions)[:, None], np.arange(train.num_images)[None, :]
    relation = ((3 * c + i) % 4 == 0) | (train.txt2img.numpy()[:, None] == i)
    split = replace(train, fits=lambda cap, img: relation[np.ix_(cap, img)])
    order = torch.tensor([7, 0, 12, 33, 5, 21, 2, 18])
    batch = ShardedBatches(split, [order], lambda size: (0, size))[0]
    want = torch.from_numpy(relation[np.ix_(order.numpy(), train.txt2img[order].numpy())].T)
    assert not torch.equal(want, want.T)  # the test tells rows from columns
    assert batch.ignore.dtype == torch.bool
    assert torch.equal(batch.ignore, want), (batch.ignore, want)
    assert torch.equal(batch.img_ids, train.txt2img[order])
    unmasked = ShardedBatches(split, [order], lambda size: (0, size), mask_false_negatives=False)[0]
    assert unmasked.ignore is None


def test_cli_train_eval_demo_smoke(tmp_path, capsys):
    common = [f"output_dir={tmp_path}", f"data.cache_dir={tmp_path / 'cache'}", *TINY]
    assert main(["train", "name=cli", "train.epochs=1", "model.seps.variant=code", *common]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "rsum" in out
    assert main(["eval", str(tmp_path / "cli"), "eval.split=dev"]) == 0
    metrics = json.loads((tmp_path / "cli" / "eval_dev.json").read_text())
    assert set(metrics) >= {"i2t_r1", "t2i_r1", "rsum", "oracle_rsum"}
    # evaluation output is never overwritten silently
    assert main(["eval", str(tmp_path / "cli"), "eval.split=dev"]) == 2


def _tiny_demo(tmp_path) -> list[str]:
    """The demo's overrides for a few synthetic images (steps and plots left to the test)."""
    return [
        f"output_dir={tmp_path}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.num_train=20",
        "data.num_dev=12",
        "data.num_test=12",
        "train.batch_size=16",
        "train.eval_every=0",
        "train.eval_max_images=0",
        "train.num_threads=1",
        "eval.max_memory_mb=16",
    ]


def test_demo_smoke_fine_tunes_the_shipped_encoders(tmp_path, capsys):
    # The demo's recipe on a few synthetic images, a few steps: the shipped pretrained encoders (64 px
    # scenes, their vocabulary), the table on stdout, the summary with selection quality, the plots.
    common = _tiny_demo(tmp_path)
    assert main(["demo", *common, "train.max_steps=3"]) == 0
    printed = capsys.readouterr().out
    assert "oracle" in printed and "rsum" in printed and "pretrained encoders alone" in printed
    demo = tmp_path / "demo"
    summary = json.loads((demo / "summary.json").read_text())
    assert {"rsum", "oracle_rsum", "t2i_r1", "pretrained_global", "selection_object_recall"} <= set(summary)
    # the shipped encoders were pretrained with FILIP: their own token-wise score is reported too
    assert summary["pretrained_native"]["matcher"] == "filip" and "filip, the score" in printed
    assert summary["steps"] == 3 and "time_budget_s: 0.0" in (demo / "config.yaml").read_text()
    assert (demo / "training_curve.png").stat().st_size > 1000
    assert (demo / "retrievals.png").stat().st_size > 1000
    # a second demo moves the first aside instead of overwriting it
    assert main(["demo", *common, "train.max_steps=1", "--no-plots"]) == 0
    assert len(list(tmp_path.glob("demo-*"))) == 1


def test_bad_overrides_are_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown config key"):
        apply_overrides(RunConfig(), ["train.lr_typo=1"])
    with pytest.raises(ValueError, match="expects a number"):
        apply_overrides(RunConfig(), ["train.lr=fast"])
    assert main(["train", f"output_dir={tmp_path}", "train.nope=1"]) == 2


def test_numeric_strings_only_in_plain_decimal_form(tmp_path):
    """A quoted number in a YAML file loads (PyYAML reads ``1e-4`` as a string too), but int()/float()'s
    own extras (whitespace, digit underscores, inf/nan words) are refused, naming the key."""
    config = tmp_path / "run.yaml"
    config.write_text('train:\n  epochs: "30"\n  lr: "2e-4"\n  grad_clip: .5\n')
    cfg = load_config(RunConfig, config)
    assert (cfg.train.epochs, cfg.train.lr, cfg.train.grad_clip) == (30, 2e-4, 0.5)
    assert apply_overrides(RunConfig(), ["train.lr=1e-4"]).train.lr == 1e-4
    for text, message in [
        ('" 3_0 "', "train.epochs: expects an integer, got ' 3_0 '"),
        ('"1e3"', "train.epochs: expects an integer, got '1e3'"),
    ]:
        config.write_text(f"train:\n  epochs: {text}\n")
        with pytest.raises(ValueError, match=re.escape(message)):
            load_config(RunConfig, config)
    for override in ["train.lr='nan'", "train.lr=' 0.1'", "train.lr=infinity"]:
        with pytest.raises(ValueError, match="train.lr: expects a number"):
            apply_overrides(RunConfig(), [override])


def test_shipped_configs_load():

    configs = sorted((ROOT / "configs").glob("*.yaml"))
    assert configs
    for path in configs:
        cfg = load_config(RunConfig, path)
        assert cfg.name == path.stem or cfg.name  # every preset names its run


@pytest.mark.parametrize("progress", [True, False])
def test_training_shows_a_step_bar_only_where_asked(tmp_path, tiny_data, capsys, progress):
    """A terminal gets a bar over the planned steps (epochs x batches, capped by max_steps) with the
    logged loss beside it; progress=false (and a log file) gets the periodic log lines only."""
    cfg = _cfg(tmp_path, "train.epochs=2", "train.max_steps=3", f"progress={str(progress).lower()}")
    train_run(cfg, data=tiny_data)
    err = capsys.readouterr().err
    if progress:
        assert re.search(r"train: +100%.*\b3/3 ", err), err
        assert "loss=" in err
    else:
        assert "train:" not in err


def test_a_stopped_demo_names_both_ways_to_go_on(tmp_path, monkeypatch, capsys):
    """``patchword train --resume`` finishes a stopped demo's training but makes none of its table and
    plots, and a new demo moves the stopped run aside. Old code advised the resume alone (helper-213's
    fuzzing: following it, the table and plots never came)."""
    real_step = trainer.Trainer._train_step

    def step_then_signal(self, *args, **kwargs):
        real_step(self, *args, **kwargs)
        if self.step == 1:  # the second step's: the loop stops once it ends (step 2, last.pt written)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(trainer.Trainer, "_train_step", step_then_signal)
    code = main(["demo", *_tiny_demo(tmp_path), "train.max_steps=4", "--no-plots"])
    assert code == 128 + signal.SIGTERM
    run = tmp_path / "demo"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"interrupted: SIGTERM received: stopped at step 2, {run / 'last.pt'} written; continue its training "
        f"with `patchword train --resume {run}` (the demo's table and plots are not made then), or run the "
        f"same `patchword demo` command again to start over ({run} is moved aside)"
    )
