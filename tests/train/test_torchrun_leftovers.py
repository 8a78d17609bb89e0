"""What a torchrun launch left over, checked in this process: the tiny ViT's CLS token gradient laid out as
the parameter (DDP warned of every shard of one image), a stop signal during ``torch.load`` that comes out
as itself (not as a damaged checkpoint), ``patchword eval`` quiet on the other ranks as training is, and a
resume that reads ``metrics.jsonl`` once. The launch-wide checks (fewer captions than processes, the
signal a stop names, no stride warning from any process) are in ``test_distributed_agreement.py``.
"""

from __future__ import annotations

import argparse
import builtins
import io
import json
import logging
import os
import signal
from pathlib import Path

import pytest
import torch

from conftest import TINY_RUN_32
from patchword.config import apply_overrides
from patchword.encoders.context import ContextConfig, ContextTransformer
from patchword.encoders.tiny import TinyViT, TinyViTConfig
from patchword.errors import Interrupted
from patchword.readers import read_checkpoint, read_safetensors
from patchword.runs.config import RunConfig
from patchword.train.process import StopNow, TrainingInterrupted

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------- the CLS token


@pytest.mark.parametrize("stem", ["patch", "conv"])
@pytest.mark.parametrize("batch", [1, 3])
def test_every_tiny_vit_gradient_is_laid_out_as_its_parameter_with_the_same_values(batch, stem):
    """Old code: for a batch of one image (a process's shard under torchrun, a stand-in row) the CLS token's
    gradient was the concatenation's slice, strides (65 * 16, 16, 1) against the parameter's (16, 16, 1),
    and DDP warned "Grad strides do not match bucket view strides" in every such process."""
    torch.manual_seed(0)
    cfg = TinyViTConfig(image_size=16, patch_size=8, width=16, depth=1, heads=2, embed_dim=8, stem=stem)
    vit = TinyViT(cfg).double().eval()  # eval: the conv stem's BatchNorm uses its running statistics
    images = torch.randn(batch, 3, 16, 16, dtype=torch.float64)
    out = vit(images)
    out.square().sum().backward()
    grads = {name: p.grad.clone() for name, p in vit.named_parameters()}
    assert {n: p.grad.stride() for n, p in vit.named_parameters()} == {
        n: p.stride() for n, p in vit.named_parameters()
    }
    # the forward before: the (1, 1, width) parameter expanded as it is; same outputs and gradients
    vit.zero_grad(set_to_none=True)
    x = vit.patch_embed(images).flatten(2).transpose(1, 2)
    x = torch.cat([vit.cls_token.expand(batch, -1, -1), x], dim=1) + vit.pos_embed
    before = vit.proj(vit.encoder(vit.pos_drop(x)))
    before.square().sum().backward()
    assert torch.equal(out, before)
    for name, p in vit.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=0, atol=1e-12, msg=name)


@pytest.mark.parametrize("batch", [1, 3])
def test_the_context_transformers_global_token_gradient_is_laid_out_as_its_parameter(batch):
    """Old code: TGDT's global token (``ContextConfig.global_token``) was expanded from (1, 1, C) as the
    ViT's CLS row was; for one item its gradient had strides (L' * C, C, 1) against (C, C, 1)."""
    torch.manual_seed(0)
    ctx = ContextTransformer(8, ContextConfig(layers=1, heads=2, ffn_dim=16, dropout=0.0, global_token=True))
    ctx = ctx.double()
    tokens = torch.randn(batch, 5, 8, dtype=torch.float64)
    ctx(tokens).square().sum().backward()
    grad = ctx.global_token.grad
    assert grad.stride() == ctx.global_token.stride()
    # the forward before: the (1, 1, C) parameter expanded as it is; the same gradient
    ctx.zero_grad(set_to_none=True)
    x = torch.cat([ctx.global_token.expand(batch, -1, -1), tokens], 1)
    for layer in ctx.layers:
        x = layer(x)
    x.square().sum().backward()
    torch.testing.assert_close(grad, ctx.global_token.grad, rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------- readers


def _stops(tmp_path: Path) -> dict[str, BaseException]:
    checkpoint = tmp_path / "run" / "last.pt"
    return {
        "interrupted": Interrupted(signal.SIGTERM, "SIGTERM received before training resumed"),
        "training": TrainingInterrupted(signal.SIGINT, 3, checkpoint),
        "keyboard": KeyboardInterrupt(),
        "stop_now": StopNow(),
    }


@pytest.mark.parametrize("stop", ["interrupted", "training", "keyboard", "stop_now"])
def test_a_stop_signal_during_torch_load_comes_out_as_itself(tmp_path, monkeypatch, stop):
    """Old code: an Interrupted raised by the stop handler inside torch.load became "not a readable
    checkpoint: the archive is damaged" (a DataError naming a sound file)."""
    path = tmp_path / "last.pt"
    torch.save({"model": {}}, path)
    raised = _stops(tmp_path)[stop]

    def load(*args, **kwargs):
        raise raised

    monkeypatch.setattr(torch, "load", load)
    with pytest.raises(type(raised)) as caught:
        read_checkpoint(path, require=("model",))
    assert caught.value is raised


@pytest.mark.parametrize("stop", ["interrupted", "keyboard"])
def test_a_stop_signal_during_a_safetensors_read_comes_out_as_itself(tmp_path, monkeypatch, stop):
    import safetensors.torch

    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file({"w": torch.zeros(2)}, str(path))
    raised = _stops(tmp_path)[stop]

    def load_file(*args, **kwargs):
        raise raised

    monkeypatch.setattr(safetensors.torch, "load_file", load_file)
    with pytest.raises(type(raised)) as caught:
        read_safetensors(path)
    assert caught.value is raised


# ------------------------------------------------------------------------------------- eval's logging


def test_eval_on_another_rank_logs_errors_but_not_the_project_s_warnings(tmp_path, monkeypatch, caplog):
    """Old code: `patchword eval` under torchrun set only the root logger's level on the other ranks, so
    every process logged patchword's warnings (the same in each); training already quiets them."""
    import patchword.distributed
    import patchword.runs.evaluate
    from patchword.cli import evaluate as cli_evaluate
    from patchword.distributed import LaunchInfo

    def fake_evaluate(run_dir, checkpoint, **kwargs):
        logging.getLogger("patchword.runs.evaluate").warning("the same in every process")
        logging.getLogger("patchword.data.images").warning("an image this process decoded")
        logging.getLogger("patchword.eval.protocol").error("this process's failure")
        return {}, tmp_path / "eval_test.json"

    monkeypatch.setattr(patchword.distributed, "launch_info", lambda: LaunchInfo(1, 2, 1, "torchrun"))
    monkeypatch.setattr(patchword.runs.evaluate, "evaluate_run_dir", fake_evaluate)
    parser = argparse.ArgumentParser()
    cli_evaluate.add_arguments(parser)
    levels = {name: logging.getLogger(name).level for name in ("", "patchword", "patchword.data.images")}
    try:
        cli_evaluate.run(parser.parse_args([str(tmp_path / "run")]))
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [("WARNING", "an image this process decoded"), ("ERROR", "this process's failure")]


# ------------------------------------------------------------------------------------- resume's reads


def test_a_resume_reads_the_metrics_log_once_before_it_trains(tmp_path, monkeypatch):
    """A run stopped by SIGTERM after step 2 (no validation step), resumed with train.max_steps=2: the
    resume ends the run there and validates step 2 first. Old code read metrics.jsonl three times before
    training went on: to see whether there was nothing to do, to drop the redone steps' records, and again
    to see whether step 2 was validated."""
    from patchword.train import trainer as trainer_module
    from patchword.train.runner import resume_run, train_run

    overrides = [*TINY_RUN_32, f"output_dir={tmp_path}", "name=run", f"data.cache_dir={tmp_path / 'cache'}"]
    original_step = trainer_module.Trainer._train_step

    def step_then_signal(self, *args, **kwargs):
        original_step(self, *args, **kwargs)
        if self.step == 1:  # during step 2 (counted once it is done)
            os.kill(os.getpid(), signal.SIGTERM)

    with monkeypatch.context() as patched:
        patched.setattr(trainer_module.Trainer, "_train_step", step_then_signal)
        with pytest.raises(TrainingInterrupted) as stopped:
            train_run(apply_overrides(RunConfig(), [*overrides, "train.max_steps=4"]))
    assert stopped.value.step == 2
    run = tmp_path / "run"

    reads: list[str] = []
    opened, fit = io.open, trainer_module.Trainer.fit
    at_fit: list[int] = []

    def counting_open(file, mode="r", *args, **kwargs):
        if str(file).endswith("metrics.jsonl") and "r" in mode and "+" not in mode:
            reads.append(str(file))
        return opened(file, mode, *args, **kwargs)

    def noting_fit(self):
        at_fit.append(len(reads))
        return fit(self)

    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(trainer_module.Trainer, "fit", noting_fit)
    summary = resume_run(run, ["train.max_steps=2"])
    assert at_fit == [1], reads
    assert summary["steps"] == 2
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["split"], r["step"]) for r in records] == [("train", 1), ("train", 2), ("dev", 2)]
