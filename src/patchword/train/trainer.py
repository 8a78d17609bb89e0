"""The training loop: hinge + ratio loss, official schedule, dev validation, atomic resumable checkpoints."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from patchword.data.pipeline import EncodedSplit
from patchword.eval.protocol import evaluate
from patchword.losses import CMCLoss, HingeLoss, RatioLoss
from patchword.model import RetrievalModel
from patchword.train.augment import CaptionAugmenter
from patchword.train.checkpoint import atomic_save, load_checkpoint, rng_state, set_rng_state
from patchword.train.config import RunConfig

__all__ = ["Trainer", "TrainingInterrupted", "autocast_context", "torch_threads"]

_logger = logging.getLogger(__name__)


def autocast_context(precision: str, device: torch.device):
    """``torch.autocast`` from a precision string; fp32 means no autocast."""
    if precision == "fp32":
        return nullcontext()
    dtypes = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}
    if precision not in dtypes:
        raise ValueError(f"precision must be fp32, amp_bf16 or amp_fp16, got {precision!r}")
    return torch.autocast(device_type=device.type, dtype=dtypes[precision])


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Use ``count`` intra-op CPU threads inside the block (0: leave torch's setting), then restore."""
    previous = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class TrainingInterrupted(Exception):
    """SIGTERM / SIGINT arrived; ``last.pt`` was written at ``step`` and the run can be resumed."""

    def __init__(self, signum: int, step: int, checkpoint: Path) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        name = signal.Signals(signum).name
        super().__init__(f"{name} received: stopped at step {step}, {checkpoint} written")


@contextlib.contextmanager
def _stop_signals(flag: dict[str, int]) -> Iterator[None]:
    """Record SIGTERM / SIGINT in ``flag["signum"]`` instead of dying mid-step (cluster pre-emption)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed from the main thread
        return

    def handler(signum, frame):  # noqa: ARG001
        flag["signum"] = signum

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class Trainer:
    """Trains ``model`` on ``train``, validates on ``dev``, writes checkpoints to ``run_dir``.

    Checkpoints: ``last.pt`` (everything needed to resume: model, optimizer, scheduler, scaler, position
    in the epoch, best dev rsum, RNG states) after every validation, every ``train.checkpoint_every``
    steps, at the end and when SIGTERM / SIGINT arrive; ``best.pt`` (model weights and their dev metrics)
    whenever dev rSum improves. Batches are a per-epoch permutation seeded by (seed, epoch) and caption
    augmentation is seeded by (seed, step), so a resumed run sees exactly the batches an uninterrupted run
    would have seen.
    """

    def __init__(
        self,
        cfg: RunConfig,
        model: RetrievalModel,
        train: EncodedSplit,
        dev: EncodedSplit,
        run_dir: Path,
        *,
        device: torch.device | str = "cpu",
        tokenizer=None,
    ) -> None:
        self.cfg = cfg
        self.tc = cfg.train
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.train_split = train
        self.dev_split = dev.first_images(self.tc.eval_max_images)
        self.run_dir = run_dir
        self.optimizer = torch.optim.AdamW(
            model.parameter_groups(self.tc.lr, self.tc.backbone_lr_mult), weight_decay=self.tc.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(
            self.optimizer, milestones=list(self.tc.lr_milestones), gamma=self.tc.lr_decay
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.precision == "amp_fp16")
        self.hinge = HingeLoss(margin=self.tc.margin)
        matcher = model.matcher
        self.ratio = RatioLoss(matcher.selection_ratio or 1.0, mode=matcher.ratio_mode)
        self.global_loss = CMCLoss(margin=self.tc.margin) if matcher.global_loss == "cmc" else None
        augment = cfg.data.size_augment if cfg.data.size_augment is not None else cfg.data.tokenizer == "bert"
        self.augmenter = None
        if augment:
            if tokenizer is None:
                raise ValueError("data.size_augment needs the tokenizer (Trainer(..., tokenizer=...))")
            self.augmenter = CaptionAugmenter(
                tokenizer, train, cfg.data.max_caption_len, cfg.data.max_dense_len, cfg.seed
            )
        self.epoch = 0
        self.batch_in_epoch = 0
        self.step = 0
        self.best_rsum = -math.inf
        self.skipped_steps = 0
        self.history: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "step": self.step,
            "best_rsum": self.best_rsum,
            "skipped_steps": self.skipped_steps,
            "rng": rng_state(),
            "config": asdict(self.cfg),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.epoch, self.batch_in_epoch, self.step = state["epoch"], state["batch_in_epoch"], state["step"]
        self.best_rsum, self.skipped_steps = state["best_rsum"], state["skipped_steps"]
        set_rng_state(state["rng"])

    def resume(self, path: str | Path) -> None:
        self.load_state_dict(load_checkpoint(path, map_location=self.device))
        _logger.info(
            "resumed from %s at epoch %d, batch %d, step %d", path, self.epoch, self.batch_in_epoch, self.step
        )

    def save_last(self) -> None:
        atomic_save(self.state_dict(), self.run_dir / "last.pt")

    # ------------------------------------------------------------------ loop
    def fit(self) -> dict[str, Any]:
        """Train until ``epochs``, ``max_steps`` or ``time_budget_s``; returns the best dev metrics.

        Raises:
            TrainingInterrupted: SIGTERM / SIGINT arrived (after ``last.pt`` was written).
        """
        flag: dict[str, int] = {}
        with torch_threads(self.tc.num_threads), _stop_signals(flag):
            return self._fit(flag)

    def _fit(self, flag: dict[str, int]) -> dict[str, Any]:
        tc = self.tc
        start = time.perf_counter()
        stop = False
        while self.epoch < tc.epochs and not stop:
            batches = self._epoch_batches(self.epoch)
            while self.batch_in_epoch < len(batches):
                self._train_step(batches[self.batch_in_epoch], len(batches))
                self.batch_in_epoch += 1
                self.step += 1
                if self.step in tc.lr_milestone_steps:
                    for group in self.optimizer.param_groups:
                        group["lr"] *= tc.lr_decay
                if "signum" in flag:
                    self.save_last()
                    raise TrainingInterrupted(flag["signum"], self.step, self.run_dir / "last.pt")
                out_of_time = tc.time_budget_s and time.perf_counter() - start >= tc.time_budget_s
                stop = bool((tc.max_steps and self.step >= tc.max_steps) or out_of_time)
                if tc.eval_every and self.step % tc.eval_every == 0 and not stop:
                    self.validate()
                elif tc.checkpoint_every and self.step % tc.checkpoint_every == 0:
                    self.save_last()
                if stop:
                    break
            if self.batch_in_epoch >= len(batches):
                self.epoch += 1
                self.batch_in_epoch = 0
                self.scheduler.step()
            self.validate()
        return {
            "best_dev_rsum": self.best_rsum,
            "steps": self.step,
            "epochs_done": self.epoch,
            "skipped_steps": self.skipped_steps,
            "train_seconds": time.perf_counter() - start,
        }

    def _epoch_batches(self, epoch: int) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(self.cfg.seed * 100003 + epoch)
        perm = torch.randperm(self.train_split.num_captions, generator=gen)
        batches = list(perm.split(self.tc.batch_size))
        # A one-caption batch has no negatives; fold it into the previous batch.
        if len(batches) > 1 and batches[-1].numel() < 2:
            batches[-2] = torch.cat([batches[-2], batches.pop()])
        return batches

    def _batch_text(self, cap_idx: torch.Tensor, img_idx: torch.Tensor):
        """Caption ids/lens and dense ids/lens of a batch, trimmed to their longest row."""
        data = self.train_split
        if self.augmenter is not None:
            ids, lens, dense_ids, dense_lens = self.augmenter(cap_idx, img_idx, self.step)
        else:
            lens = data.cap_lens[cap_idx]
            ids = data.cap_ids[cap_idx, : int(lens.max())]
            dense_ids = dense_lens = None
            if data.dense_ids is not None:
                dense_lens = data.dense_lens[img_idx]
                dense_ids = data.dense_ids[img_idx, : int(dense_lens.max())]
        return ids, lens, dense_ids, dense_lens

    def _train_step(self, cap_idx: torch.Tensor, n_batches: int) -> None:
        tc, data, dev = self.tc, self.train_split, self.device
        self.model.train()
        img_idx = data.txt2img[cap_idx]
        images = data.images.batch(img_idx, train=True).to(dev)
        ids, lens, dense_ids, dense_lens = self._batch_text(cap_idx, img_idx)
        if dense_ids is not None:
            dense_ids, dense_lens = dense_ids.to(dev), dense_lens.to(dev)
        ignore = None
        if tc.mask_false_negatives and data.fits is not None:
            fits = data.fits(cap_idx.numpy(), img_idx.numpy())  # (B_t, B_v)
            ignore = torch.from_numpy(np.ascontiguousarray(fits.T)).to(dev)
        with autocast_context(self.cfg.precision, dev):
            decisions, extras = [], {}
            if self.step < tc.global_warmup_steps:
                sims = self.model.global_sims(images, ids.to(dev), lens.to(dev))
            else:
                out = self.model(images, ids.to(dev), lens.to(dev), dense_ids, dense_lens)
                sims, decisions, extras = out.sims, out.decisions, out.extras
        sims = sims.float()
        img_ids = img_idx.to(dev)
        hardest = self.epoch >= tc.hardest_after_epochs
        align = self.hinge(sims, img_ids=img_ids, ignore=ignore, max_violation=hardest)
        if self.global_loss is not None and "global_img" in extras:
            # The CMC ranking term follows the same sum -> hardest-negative schedule as the hinge.
            align = align + self.global_loss(
                extras["global_img"].float(), extras["global_txt"].float(), img_ids, max_violation=hardest
            )
        if self.epoch < tc.align_warmup_epochs:
            # official warm-up: the alignment term grows linearly over the first epoch(s)
            align = align * min(
                1.0, (self.epoch * n_batches + self.batch_in_epoch) / (tc.align_warmup_epochs * n_batches)
            )
        ratio = self.ratio(decisions) if decisions else sims.new_zeros(())
        loss = align + tc.ratio_weight * ratio
        if not torch.isfinite(loss):
            self.skipped_steps += 1
            _logger.warning(
                "non-finite loss at step %d: step skipped (%d so far)", self.step, self.skipped_steps
            )
            self.optimizer.zero_grad(set_to_none=True)
            return
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if tc.grad_clip:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if tc.log_every and self.step % tc.log_every == 0:
            record = {
                "split": "train",
                "step": self.step,
                "epoch": self.epoch,
                "loss": loss.item(),
                "align": align.item(),
                "ratio": ratio.item(),
                "lr": self.optimizer.param_groups[0]["lr"],
                "time": time.time(),
            }
            _logger.info("step %d epoch %d loss %.4f", self.step, self.epoch, record["loss"])
            self._log(record)

    # ------------------------------------------------------------------ validation
    def validate(self) -> dict[str, float]:
        """Dev metrics under the run's evaluation protocol (the one the test is reported with)."""
        eval_cfg = replace(self.cfg.eval, coco_1k=False)  # the 1K folds are a test-split protocol
        metrics = evaluate(
            self.model, self.dev_split, eval_cfg, device=self.device, progress=self.cfg.progress
        )
        record = {"split": "dev", "step": self.step, "epoch": self.epoch, **metrics, "time": time.time()}
        self._log(record)
        _logger.info(
            "dev @ step %d: rsum %.1f (t2i R@1 %.1f, i2t R@1 %.1f)",
            self.step,
            metrics["rsum"],
            metrics["t2i_r1"],
            metrics["i2t_r1"],
        )
        if metrics["rsum"] > self.best_rsum:
            self.best_rsum = metrics["rsum"]
            atomic_save(
                {
                    "model": self.model.state_dict(),
                    "metrics": metrics,
                    "step": self.step,
                    "config": asdict(self.cfg),
                },
                self.run_dir / "best.pt",
            )
        self.save_last()
        return metrics

    def _log(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        with open(self.run_dir / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")
