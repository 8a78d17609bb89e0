"""The training loop: hinge + ratio loss, official schedule, dev validation, atomic resumable checkpoints."""

from __future__ import annotations

import json
import logging
import math
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from patchword.eval.evaluate import evaluate_encoded
from patchword.losses import CMCLoss, HingeLoss, RatioLoss
from patchword.model import RetrievalModel
from patchword.train.checkpoint import atomic_save, load_checkpoint, rng_state, set_rng_state
from patchword.train.config import RunConfig
from patchword.train.data import EncodedSplit

__all__ = ["Trainer", "autocast_context"]

_logger = logging.getLogger(__name__)


def autocast_context(precision: str, device: torch.device):
    """``torch.autocast`` from a precision string; fp32 means no autocast."""
    if precision == "fp32":
        return nullcontext()
    dtypes = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}
    if precision not in dtypes:
        raise ValueError(f"precision must be fp32, amp_bf16 or amp_fp16, got {precision!r}")
    return torch.autocast(device_type=device.type, dtype=dtypes[precision])


class Trainer:
    """Trains ``model`` on ``train``, validates on ``dev``, writes checkpoints to ``run_dir``.

    Checkpoints: ``last.pt`` (everything needed to resume: model, optimizer, scheduler, scaler,
    position in the epoch, best dev rsum, RNG states) after every validation and at the end, and
    ``best.pt`` (model weights and their dev metrics) whenever dev rSum improves. Batches are a
    per-epoch permutation seeded by (seed, epoch), so a resumed run sees exactly the batches an
    uninterrupted run would have seen.
    """

    def __init__(
        self, cfg: RunConfig, model: RetrievalModel, train: EncodedSplit, dev: EncodedSplit, run_dir: Path
    ) -> None:
        self.cfg = cfg
        self.tc = cfg.train
        self.device = torch.device(cfg.device)
        self.model = model.to(self.device)
        self.train_split = train
        self.dev_split = dev.subset_images(self.tc.eval_max_images)
        self.run_dir = run_dir
        self.optimizer = torch.optim.AdamW(
            model.parameter_groups(self.tc.lr, self.tc.backbone_lr_mult), weight_decay=self.tc.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(
            self.optimizer, milestones=list(self.tc.lr_milestones), gamma=self.tc.lr_decay
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.precision == "amp_fp16")
        self.hinge = HingeLoss(margin=self.tc.margin)
        ratio_mode = getattr(model.matcher, "ratio_mode", "sum_masks")
        sparse_ratio = getattr(getattr(model.matcher, "config", None), "sparse_ratio", 1.0)
        self.ratio = RatioLoss(sparse_ratio, mode=ratio_mode)
        self.global_loss = (
            CMCLoss(margin=self.tc.margin) if getattr(model.matcher, "global_loss", None) == "cmc" else None
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
        """Train until ``epochs``, ``max_steps`` or ``time_budget_s``; returns the best dev metrics."""
        tc = self.tc
        if tc.num_threads:
            torch.set_num_threads(tc.num_threads)
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
                out_of_time = tc.time_budget_s and time.perf_counter() - start >= tc.time_budget_s
                stop = bool((tc.max_steps and self.step >= tc.max_steps) or out_of_time)
                if tc.eval_every and self.step % tc.eval_every == 0 and not stop:
                    self.validate()
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

    def _train_step(self, cap_idx: torch.Tensor, n_batches: int) -> None:
        tc, data, dev = self.tc, self.train_split, self.device
        self.model.train()
        img_idx = data.txt2img[cap_idx]
        images = data.images.batch(img_idx, train=True).to(dev)
        lens = data.cap_lens[cap_idx]
        ids = data.cap_ids[cap_idx, : int(lens.max())]
        dense_ids = dense_lens = None
        if data.dense_ids is not None:
            dense_lens = data.dense_lens[img_idx]
            dense_ids = data.dense_ids[img_idx, : int(dense_lens.max())].to(dev)
            dense_lens = dense_lens.to(dev)
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
        align = self.hinge(
            sims, img_ids=img_ids, ignore=ignore, max_violation=self.epoch >= tc.hardest_after_epochs
        )
        if self.global_loss is not None and "global_img" in extras:
            # The CMC ranking term follows the same sum -> hardest-negative schedule as the hinge.
            self.global_loss.ranking.max_violation = self.epoch >= tc.hardest_after_epochs
            align = align + self.global_loss(
                extras["global_img"].float(), extras["global_txt"].float(), img_ids
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
        metrics = evaluate_encoded(
            self.model, self.dev_split, self.cfg.eval, device=self.device, progress=self.cfg.progress
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
