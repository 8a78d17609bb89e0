"""UCMFH training loop: seeded batches, the official two-term loss, atomic checkpoints, JSONL metrics.

Training follows the official hash stage (task 1): ``L = w_f * L_con(f_I, f_T) + w_h * L_con(h_I, h_T)``
with ``w_f = 1``, ``w_h = 0.5``, Adam (betas 0.5, 0.999), lr 1e-4 for the encoder and 1e-3 for the hash
heads, batch 128 with ``drop_last``. Deliberate differences: the whole training set is used (official:
the first 4,992 pairs), runs are seeded, and the learning rate is constant (the official MultiStepLR with
gamma 1.2 stepped per iteration *raises* the head lr x1.44 within 3 epochs, which looks unintended).

The trainer never changes process-wide settings: the torch thread count (``train.num_threads``) is the
caller's (``patchword hash train`` applies it).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from patchword.checkpoint import atomic_save, load_checkpoint, rng_state, set_rng_state
from patchword.errors import ConfigError
from patchword.fileio import append_line
from patchword.hashing.config import HashRunConfig, check_hash_config
from patchword.hashing.dataset import HashDataset
from patchword.hashing.model import UCMFH
from patchword.losses import BalancedInfoNCE, HashNetLoss, InfoNCE
from patchword.runs.files import LAST_CHECKPOINT

__all__ = ["HashTrainer", "append_metrics"]

_logger = logging.getLogger(__name__)


class HashTrainer:
    """Seeded UCMFH training with atomic checkpoints (every ``save_every`` epochs and at the end) and JSONL
    metrics (one record per epoch).

    Batches are a permutation seeded by (seed, epoch), so a resumed run sees the batches an uninterrupted
    one would have seen.
    """

    def __init__(self, cfg: HashRunConfig, model: UCMFH, data: HashDataset, run_dir: Path) -> None:
        device = check_hash_config(cfg)
        if cfg.train.feature_weight and data.image_dim != data.text_dim:
            raise ConfigError(
                "train.feature_weight",
                f"the feature-level contrastive term compares image and text encoder outputs, which needs "
                f"equal dimensions (got {data.image_dim} and {data.text_dim}); set train.feature_weight=0 to "
                "train on the codes only",
            )
        self.cfg, self.tc = cfg, cfg.train
        self.device = device
        self.model = model.to(self.device)
        self.data = data
        self.run_dir = run_dir
        tc = self.tc
        groups = [
            {"params": model.encoder_parameters(), "lr": tc.lr_encoder},
            {"params": model.head_parameters(), "lr": tc.lr_heads},
        ]
        # One optimiser with two groups equals the official three Adam instances (Adam is per parameter).
        if tc.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(groups, lr=tc.lr_heads, weight_decay=tc.weight_decay)
        else:
            cls = torch.optim.AdamW if tc.optimizer == "adamw" else torch.optim.Adam
            self.optimizer = cls(groups, betas=tuple(tc.betas), weight_decay=tc.weight_decay)
        self.feature_loss = self._contrastive(tc.loss)
        if tc.loss == "hashnet":
            self.hash_loss = HashNetLoss(alpha=tc.hashnet_alpha or 10.0 / model.bits)
        else:
            self.hash_loss = self._contrastive(tc.loss)
        self.image = torch.from_numpy(data.train.image)
        self.text = torch.from_numpy(data.train.text)
        rel = data.train.relevance
        self.relevance = torch.from_numpy(rel.astype(np.int64) if rel.ndim == 1 else rel.astype(np.float32))
        self.epoch = 0
        self.step = 0

    def _contrastive(self, loss: str):
        if loss == "balanced":
            return BalancedInfoNCE(self.tc.temperature)
        if loss == "infonce_i2t":
            return InfoNCE(self.tc.temperature, variant="i2t")
        return InfoNCE(self.tc.temperature)  # infonce, and the feature term of hashnet

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "epoch": self.epoch,
            "step": self.step,
            "rng": rng_state(),
            "config": asdict(self.cfg),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from what :meth:`state_dict` returned (a ``last.pt`` loaded on the CPU)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])  # moves its state to the parameters' device
        self.epoch, self.step = state["epoch"], state["step"]
        set_rng_state(state["rng"])

    def resume(self, path: Path) -> None:
        # On the CPU: the generator states must stay CPU tensors (torch.set_rng_state refuses others), and
        # the model and optimiser copy their tensors to the training device themselves.
        self.load_state_dict(load_checkpoint(path, map_location="cpu"))
        _logger.info("resumed %s at epoch %d", path, self.epoch)

    def _batches(self, epoch: int) -> list[torch.Tensor]:
        n = self.image.shape[0]
        gen = torch.Generator().manual_seed(self.tc.seed * 100003 + epoch)
        perm = torch.randperm(n, generator=gen)
        bs = min(self.tc.batch_size, n)  # a training set smaller than one batch is one batch
        batches = list(perm.split(bs))
        if self.tc.drop_last and len(batches) > 1 and len(batches[-1]) < bs:
            batches.pop()
        return [b for b in batches if len(b) >= 2]

    def _loss(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        img, txt = self.image[idx].to(self.device), self.text[idx].to(self.device)
        out = self.model(img, txt)
        feat = (
            self.feature_loss(out.img_feat, out.txt_feat)
            if self.tc.feature_weight
            else out.img_hash.new_zeros(())
        )
        if self.tc.loss == "hashnet":
            rel = self.relevance[idx].to(self.device)
            code = self.hash_loss(out.img_hash, out.txt_hash, rel, rel)
        else:
            code = self.hash_loss(out.img_hash, out.txt_hash)
        total = self.tc.feature_weight * feat + self.tc.hash_weight * code
        return {"loss": total, "loss_feature": feat, "loss_hash": code}

    def fit(self) -> dict[str, Any]:
        """Train to ``epochs``; one JSONL record and one atomic ``last.pt`` per epoch."""
        start = time.perf_counter()
        while self.epoch < self.tc.epochs:
            self.model.train()
            sums: dict[str, float] = {}
            batches = self._batches(self.epoch)
            for idx in batches:
                losses = self._loss(idx)
                if not torch.isfinite(losses["loss"]):
                    raise FloatingPointError(f"non-finite loss at epoch {self.epoch}, step {self.step}")
                self.optimizer.zero_grad(set_to_none=True)
                losses["loss"].backward()
                self.optimizer.step()
                self.step += 1
                for k, v in losses.items():
                    sums[k] = sums.get(k, 0.0) + float(v.detach())
            self.epoch += 1
            record = {
                "split": "train",
                "epoch": self.epoch,
                "step": self.step,
                **{k: v / max(1, len(batches)) for k, v in sums.items()},
                "elapsed_s": round(time.perf_counter() - start, 3),
            }
            append_metrics(self.run_dir, record)
            # A CLIP-sized model with Adam state is ~350 MB: checkpoint every few epochs, and at the end.
            if self.epoch == self.tc.epochs or (self.tc.save_every and self.epoch % self.tc.save_every == 0):
                atomic_save(self.state_dict(), self.run_dir / LAST_CHECKPOINT)
        if not (self.run_dir / LAST_CHECKPOINT).exists():  # epochs == 0 (evaluate an untrained model)
            atomic_save(self.state_dict(), self.run_dir / LAST_CHECKPOINT)
        return {"epochs": self.epoch, "steps": self.step, "train_seconds": time.perf_counter() - start}


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    """Append one JSON record to ``run_dir/metrics.jsonl`` (append-only: earlier records are kept, a failed
    write leaves no torn line)."""
    append_line(run_dir / "metrics.jsonl", json.dumps(record))
