"""UCMFH training loop: seeded batches, the official two-term loss, atomic checkpoints, JSONL metrics.

Training follows the official hash stage (task 1): ``L = w_f * L_con(f_I, f_T) + w_h * L_con(h_I, h_T)``
with ``w_f = 1``, ``w_h = 0.5``, Adam (betas 0.5, 0.999), lr 1e-4 for the encoder and 1e-3 for the hash
heads, batch 128 with ``drop_last``. Deliberate differences: the whole training set is used (official:
the first 4,992 pairs), runs are seeded, and the learning rate is constant (the official MultiStepLR with
gamma 1.2 stepped per iteration *raises* the head lr x1.44 within 3 epochs, which looks unintended).

The trainer never changes process-wide settings: the torch thread count (``train.num_threads``) is the
caller's (``patchword hash train`` applies it). During :meth:`HashTrainer.fit` SIGTERM / SIGINT stop the
run after the step in progress with ``last.pt`` written (:class:`HashTrainingInterrupted`), as
``patchword train`` does: a cluster's pre-emption leaves seconds, not an epoch.

Progress is one INFO line per epoch (losses, training time), at most one every :data:`LOG_EVERY_S`
seconds besides the first and the last epoch, as ``patchword train`` logs every ``train.log_every`` steps.

On an accelerator the step loop does not wait for the device: the training set is uploaded once, each
epoch's order once, the losses are summed on the device and read once an epoch (for its metrics record,
which also checks them for NaN / inf).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from patchword._validation import check_all_finite, values_checked
from patchword.checkpoint import atomic_save, rng_state, set_rng_state
from patchword.errors import ConfigError, Interrupted, PatchwordError, ResumeHint
from patchword.fileio import append_line
from patchword.hashing.config import HashRunConfig, check_hash_config, hashnet_alpha
from patchword.hashing.dataset import HashDataset
from patchword.hashing.model import UCMFH
from patchword.losses import BalancedInfoNCE, HashNetLoss, InfoNCE
from patchword.runs.files import LAST_CHECKPOINT
from patchword.train.process import record_stop_signals

__all__ = [
    "HashTrainer",
    "HashTrainingInterrupted",
    "NonFiniteLossError",
    "append_metrics",
    "check_batch_size",
]

_logger = logging.getLogger(__name__)

#: The per-step losses, in the order of the device-side sums (and of a checkpoint's ``epoch_loss_sums``).
LOSS_KEYS = ("loss", "loss_feature", "loss_hash")

#: Seconds between two progress lines: an epoch of a small set takes milliseconds, and a line for each
#: would bury everything else. The first epoch of a session and the last of the run always get one.
LOG_EVERY_S = 5.0


class HashTrainingInterrupted(Interrupted):
    """SIGTERM / SIGINT arrived during :meth:`HashTrainer.fit`; ``last.pt`` was written at ``step`` and
    ``patchword hash train --resume`` continues the run (exit code 128 + signal)."""

    def __init__(self, signum: int, epoch: int, batch_in_epoch: int, step: int, checkpoint: Path) -> None:
        self.epoch, self.step, self.checkpoint = epoch, step, checkpoint
        hint = ResumeHint.resume("patchword hash train", checkpoint.parent)
        where = (
            f"{batch_in_epoch} batches into epoch {epoch + 1}" if batch_in_epoch else f"end of epoch {epoch}"
        )
        super().__init__(signum, hint.stopped(signum, step, checkpoint, where))


class NonFiniteLossError(PatchwordError, FloatingPointError):
    """A training loss became NaN / inf: features too large for the learning rates, not a bug (one line,
    exit 2); the message says what was kept and what to change."""


class HashTrainer:
    """Seeded UCMFH training with atomic checkpoints (every ``save_every`` epochs, at the end and on
    SIGTERM / SIGINT) and JSONL metrics (one record per epoch).

    Batches are a permutation seeded by (seed, epoch), and a checkpoint records the position in the epoch,
    the epoch's loss sums so far and the random generators, so a resumed run (from any step) sees the
    batches, draws the dropout masks and writes the records an uninterrupted one would have.
    ``train_seconds`` counts the training time of every session of the run (a resume adds its own).

    Args:
        cfg: the run's config.
        model: the model to train (moved to the device).
        data: its data; the training split is uploaded to the device whole.
        run_dir: where ``metrics.jsonl`` and ``last.pt`` go.
        device: where to train; ``cfg.device`` when None (tests pass a simulated device).
    """

    def __init__(
        self,
        cfg: HashRunConfig,
        model: UCMFH,
        data: HashDataset,
        run_dir: Path,
        *,
        device: str | torch.device | None = None,
    ) -> None:
        resolved = check_hash_config(cfg)
        if cfg.train.feature_weight and data.image_dim != data.text_dim:
            raise ConfigError(
                "train.feature_weight",
                f"the feature-level contrastive term compares image and text encoder outputs, which needs "
                f"equal dimensions (got {data.image_dim} and {data.text_dim}); set train.feature_weight=0 to "
                "train on the codes only",
            )
        if len(data.train) < 2:  # every batch would be dropped: a run of 0 steps that reports success
            raise ConfigError(
                "data.num_train", f"{len(data.train)} training pair(s); a contrastive batch needs at least 2"
            )
        self.cfg, self.tc = cfg, cfg.train
        self.device = resolved if device is None else torch.device(device)
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
            self.hash_loss = HashNetLoss(alpha=hashnet_alpha(cfg))  # unset: 10 / bits
        else:
            self.hash_loss = self._contrastive(tc.loss)
        # On the device once: a batch is gathered there, by indices uploaded once an epoch.
        self.image = torch.from_numpy(data.train.image).to(self.device)
        self.text = torch.from_numpy(data.train.text).to(self.device)
        rel = data.train.relevance
        rel = torch.from_numpy(rel.astype(np.int64) if rel.ndim == 1 else rel.astype(np.float32))
        self.relevance = rel.to(self.device)
        # Checked once here (one read), so the steps skip the per-batch finiteness checks (one wait each).
        check_all_finite([(self.image, "training image features"), (self.text, "training text features")])
        self.epoch = 0  # completed epochs
        self.batch_in_epoch = 0  # batches of epoch ``epoch`` done
        self.step = 0
        self._sums: torch.Tensor | None = None  # (3,) device sums of LOSS_KEYS over the epoch's steps so far
        # summed in float64 as the host did (the records keep their values); MPS has no float64
        self._sum_dtype = torch.float32 if self.device.type == "mps" else torch.float64
        # Training time of the sessions before this one (from the checkpoint a resume loads), the start of
        # this session's fit, and train_seconds as the last.pt written last records it.
        self._seconds_before = 0.0
        self._fit_start: float | None = None
        self._session_seconds = 0.0
        self._saved_seconds: float | None = None
        self._saved_step: int | None = None  # the step of the last.pt this trainer wrote last
        self._logged_at: float | None = None  # when the last progress line was logged (perf_counter)

    def _contrastive(self, loss: str):
        if loss == "balanced":
            return BalancedInfoNCE(self.tc.temperature)
        if loss == "infonce_i2t":
            return InfoNCE(self.tc.temperature, variant="i2t")
        return InfoNCE(self.tc.temperature)  # infonce, and the feature term of hashnet

    @property
    def train_seconds(self) -> float:
        """Seconds spent in :meth:`fit` over every session of the run (resumes add theirs)."""
        return self._seconds_before + self.session_seconds

    @property
    def session_seconds(self) -> float:
        """Seconds spent in :meth:`fit` by this process (this session) so far."""
        running = 0.0 if self._fit_start is None else time.perf_counter() - self._fit_start
        return self._session_seconds + running

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "step": self.step,
            # the epoch's loss sums so far: a resume mid-epoch writes the record an uninterrupted run would
            "epoch_loss_sums": None if self._sums is None else self._sums.detach().cpu(),
            "train_seconds": self.train_seconds,
            "rng": rng_state(),
            "config": asdict(self.cfg),
            # rows and sha256 of the data read (build_hashing_dataset): a resume or an evaluation refuses
            # other contents under the run's file names (None: synthetic data, or data built in code)
            "data_fingerprint": self.data.info.get("fingerprint"),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from what :meth:`state_dict` returned (a ``last.pt`` loaded on the CPU)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])  # moves its state to the parameters' device
        self.epoch, self.step = state["epoch"], state["step"]
        # checkpoints of older versions were written at epoch ends only and kept no training time
        self.batch_in_epoch = int(state.get("batch_in_epoch", 0))
        sums = state.get("epoch_loss_sums")
        self._sums = sums.to(self.device) if sums is not None and self.batch_in_epoch else None
        self._seconds_before = float(state.get("train_seconds", 0.0))
        set_rng_state(state["rng"])

    def save_last(self) -> None:
        state = self.state_dict()
        self._saved_seconds, self._saved_step = state["train_seconds"], self.step
        atomic_save(state, self.run_dir / LAST_CHECKPOINT)

    def _epoch_order(self, epoch: int) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """The epoch's permutation of the training pairs (host) and its batches as ``(start, end)`` slices
        of it: batches of ``batch_size`` (the last dropped when short, with ``drop_last``), none of fewer
        than 2 pairs (no contrastive batch)."""
        n = self.image.shape[0]
        gen = torch.Generator().manual_seed(self.tc.seed * 100003 + epoch)
        perm = torch.randperm(n, generator=gen)
        # a new run refuses a batch larger than its pairs (check_batch_size); one saved before resumes
        # as it trained, in one batch of every pair
        bs = min(self.tc.batch_size, n)
        bounds = [(s, min(s + bs, n)) for s in range(0, n, bs)]
        if self.tc.drop_last and len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < bs:
            bounds.pop()
        return perm, [b for b in bounds if b[1] - b[0] >= 2]

    def _loss(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        img, txt = self.image.index_select(0, idx), self.text.index_select(0, idx)
        out = self.model(img, txt)
        feat = (
            self.feature_loss(out.img_feat, out.txt_feat)
            if self.tc.feature_weight
            else out.img_hash.new_zeros(())
        )
        if self.tc.loss == "hashnet":
            rel = self.relevance.index_select(0, idx)
            code = self.hash_loss(out.img_hash, out.txt_hash, rel, rel)
        else:
            code = self.hash_loss(out.img_hash, out.txt_hash)
        total = self.tc.feature_weight * feat + self.tc.hash_weight * code
        return {"loss": total, "loss_feature": feat, "loss_hash": code}

    def _step(self, idx: torch.Tensor) -> None:
        """One optimiser step on the pairs ``idx`` (device indices); its losses are added to the epoch's
        device-side sums, nothing is read back."""
        losses = self._loss(idx)
        self.optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        self.optimizer.step()
        step_losses = torch.stack([losses[k].detach() for k in LOSS_KEYS]).to(self._sum_dtype)
        self._sums = step_losses if self._sums is None else self._sums + step_losses
        self.batch_in_epoch += 1
        self.step += 1

    def _epoch_means(self, batches: int) -> dict[str, float]:
        """The epoch's mean losses so far (one read from the device); a NaN / inf among them stops the run
        before anything is saved (the checkpoint before it stays the last)."""
        if self._sums is None:
            return {}
        values = (self._sums / batches).tolist()
        if not all(math.isfinite(v) for v in values):
            first = self.step - self.batch_in_epoch + 1
            last = self.run_dir / LAST_CHECKPOINT
            # a start without a checkpoint is removed by the caller: nothing of it is kept
            kept = f"{last} holds the last finite state" if last.is_file() else "no checkpoint was kept"
            raise NonFiniteLossError(
                f"non-finite loss in epoch {self.epoch + 1} (steps {first}-{self.step}): normalise the "
                "features (e.g. to unit length) or lower train.lr_encoder / train.lr_heads; " + kept
            )
        return dict(zip(LOSS_KEYS, values, strict=True))

    def fit(self) -> dict[str, Any]:
        """Train to ``epochs``; one JSONL record per epoch, ``last.pt`` every ``save_every`` epochs and at
        the end.

        Returns:
            ``epochs``, ``steps``, ``train_seconds`` (every session of the run, as ``last.pt`` records it)
            and ``session_train_seconds`` (this session alone, as of the same moment).

        Raises:
            HashTrainingInterrupted: SIGTERM / SIGINT arrived (after ``last.pt`` was written).
            NonFiniteLossError: a loss was NaN / inf (nothing of its epoch is saved).
        """
        flag: dict[str, int] = {}
        # The training set was checked finite once (__init__): the per-batch checks would each wait.
        with record_stop_signals(flag), values_checked():
            self._fit_start = time.perf_counter()
            try:
                self._fit(flag)
            finally:
                self._session_seconds += time.perf_counter() - self._fit_start
                self._fit_start = None
        if self._saved_step is None and not (self.run_dir / LAST_CHECKPOINT).exists():
            self.save_last()  # epochs == 0 (evaluate an untrained model)
        # both as of one moment: the last.pt written last (the session's time was read later, and
        # exceeded the run's in a one-session run)
        seconds = self.train_seconds if self._saved_seconds is None else self._saved_seconds
        return {
            "epochs": self.epoch,
            "steps": self.step,
            "train_seconds": seconds,
            "session_train_seconds": seconds - self._seconds_before,
        }

    def _fit(self, flag: dict[str, int]) -> None:
        while self.epoch < self.tc.epochs:
            self.model.train()
            perm, bounds = self._epoch_order(self.epoch)
            order = perm.to(self.device)  # one upload an epoch; a batch is a slice of it
            for start, end in bounds[self.batch_in_epoch :]:
                self._step(order[start:end])
                if "signum" in flag and self.batch_in_epoch < len(bounds):
                    self._stop(flag["signum"], len(bounds))
            self._end_epoch(len(bounds))
            if "signum" in flag:
                self._stop(flag["signum"], len(bounds))

    def _end_epoch(self, batches: int) -> None:
        means = self._epoch_means(batches)
        self.epoch += 1
        self.batch_in_epoch = 0
        self._sums = None
        record = {
            "split": "train",
            "epoch": self.epoch,
            "step": self.step,
            **means,
            # the training time of every session of the run up to this record (a resume continues it)
            "elapsed_s": round(self.train_seconds, 3),
        }
        append_metrics(self.run_dir, record)
        self._log_progress(means)
        # A CLIP-sized model with Adam state is ~350 MB: checkpoint every few epochs, and at the end.
        if self.epoch == self.tc.epochs or (self.tc.save_every and self.epoch % self.tc.save_every == 0):
            self.save_last()

    def _log_progress(self, means: dict[str, float]) -> None:
        """One INFO line for the epoch just ended (as ``patchword train`` logs every ``train.log_every``
        steps): without it ``patchword hash train`` is silent until the end, however long it trains."""
        now = time.perf_counter()
        last = self.epoch == self.tc.epochs
        if not last and self._logged_at is not None and now - self._logged_at < LOG_EVERY_S:
            return
        self._logged_at = now
        losses = ", ".join(f"{key} {value:.4f}" for key, value in means.items())
        _logger.info(
            "epoch %d/%d step %d: %s; %.1f s",
            self.epoch,
            self.tc.epochs,
            self.step,
            losses,
            self.train_seconds,
        )

    def _stop(self, signum: int, batches: int) -> None:
        """Save (unless the epoch's end just did) and stop: pre-emption leaves seconds."""
        if self.batch_in_epoch:
            self._epoch_means(batches)  # NaN weights are not saved
        if self._saved_step != self.step:
            self.save_last()
        raise HashTrainingInterrupted(
            signum, self.epoch, self.batch_in_epoch, self.step, self.run_dir / LAST_CHECKPOINT
        )


def check_batch_size(cfg: HashRunConfig, pairs: int) -> None:
    """A new run's ``train.batch_size`` is at most its ``pairs`` training pairs: a larger one trained every
    epoch as one batch of them all while config.yaml said otherwise (``drop_last`` included).

    Raises:
        ConfigError: naming train.batch_size and the number of training pairs.
    """
    if cfg.train.batch_size > pairs:
        raise ConfigError(
            "train.batch_size",
            f"{cfg.train.batch_size} is more than the {pairs} training pairs (every epoch would be one batch "
            f"of {pairs}): give train.batch_size={pairs} or less",
        )


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    """Append one JSON record to ``run_dir/metrics.jsonl`` (append-only: earlier records are kept, a failed
    write leaves no torn line)."""
    append_line(run_dir / "metrics.jsonl", json.dumps(record))
