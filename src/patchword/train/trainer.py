"""The training loop: hinge + ratio loss, official schedule, dev validation, atomic resumable checkpoints.

One loop for one process and for ``torchrun``'s many (one per device). Every process draws the same
global batches (a permutation seeded by (seed, epoch)) and loads its contiguous shard of each; the loss of
the global batch is split between the processes so that their sum, and the summed gradients, are exactly
those of a one-process run of the same global batch (:class:`ShardLoss`). Only rank 0 logs and writes.

The trainer keeps the run's position, its checkpoints and records; its parts are modules of their own:
``feed``, ``step_modules``, ``optimiser``, ``align_warmup``, ``limits``, ``records``, ``times``, ``rng``,
``process`` (of :mod:`patchword.train`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, NoReturn

import torch

from patchword.checkpoint import atomic_save
from patchword.data.batches import ShardBatch
from patchword.data.pipeline import EncodedSplit
from patchword.distributed import Distributed
from patchword.errors import ResumeHint
from patchword.eval.protocol import evaluate
from patchword.model import RetrievalModel
from patchword.precision import weight_dtype
from patchword.progress import terminal_bar
from patchword.runs.config import RunConfig
from patchword.runs.files import BEST_CHECKPOINT, LAST_CHECKPOINT
from patchword.train.align_warmup import AlignWarmup
from patchword.train.feed import caption_augmenter, epoch_batches, max_text_widths, shard_loader
from patchword.train.limits import RunLimits
from patchword.train.optimiser import Optimiser
from patchword.train.process import (
    StopNow,
    TrainingInterrupted,
    record_stop_signals,
    stop_signals_raise,
    torch_threads,
)
from patchword.train.records import RecordLog, dev_record, fit_summary, train_record
from patchword.train.rng import rank_rng_states, restore_rng, seed_model_stream
from patchword.train.step import average_batch_norm_statistics
from patchword.train.step_modules import build_step
from patchword.train.times import RunTimes

__all__ = ["Trainer", "TrainingInterrupted"]

_logger = logging.getLogger(__name__)


class Trainer:
    """Trains ``model`` on ``train``, validates on ``dev``, writes checkpoints to ``run_dir``.

    Checkpoints: ``last.pt`` (everything needed to resume: model, optimizer, scheduler, scaler, position
    in the epoch, best dev rsum, RNG states of every process) after every validation, every
    ``train.checkpoint_every`` steps, at the end and when SIGTERM / SIGINT arrive; ``best.pt`` (model
    weights and their dev metrics) whenever dev rSum improves. A resumed run sees exactly the batches an
    uninterrupted run would have seen, whatever the number of processes (:mod:`~patchword.train.feed`).

    Validation and stops: :mod:`~patchword.train.limits`. A signal on a step to validate stops the run at
    once (pre-emption leaves seconds) with the validation recorded as due in ``last.pt``; the resume runs
    it first, so an interrupted run validates the same steps as an uninterrupted one; so does one that
    arrives during a validation's evaluation (one process: :meth:`validate`).

    Times: :attr:`train_seconds` and its parts, every session's, kept in ``last.pt``
    (:mod:`~patchword.train.times`). A training record's ``step_seconds`` is the step time per step since
    the previous record.

    Under ``torchrun`` (``dist`` with several processes) each process trains on its shard of every global
    batch; rank 0 alone logs, writes ``metrics.jsonl`` and the checkpoints. The optimiser step has no
    host synchronisation (:mod:`~patchword.train.optimiser`); losses are read back only on logging steps.
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
        dist: Distributed | None = None,
        resume_hint: ResumeHint | None = None,
    ) -> None:
        self.cfg = cfg
        self.resume_hint = resume_hint  # how a stopped run goes on (None: `patchword train --resume`)
        self.tc = tc = cfg.train
        self.dist = dist or Distributed(device=torch.device(device))
        self.device = self.dist.device if dist is not None else torch.device(device)
        self.model = model.to(self.device, weight_dtype(cfg.precision))
        self.train_split = train
        self.dev_split = dev.first_images(tc.eval_max_images)
        self.run_dir = run_dir
        self.optim = optim = Optimiser(model, cfg, self.device)
        self.optimizer, self.scheduler = optim.optimizer, optim.scheduler
        self.scaler, self.fused = optim.scaler, optim.fused
        self.augmenter = caption_augmenter(cfg, train, tokenizer)
        self._step_modules = step = build_step(model, cfg, self.dist, self.device)
        self.bf16, self.loss, self.step_fn = step.bf16, step.loss, step.step_fn
        self._align = AlignWarmup(tc, weight_dtype(cfg.precision), self.device)
        if self.dist.enabled:
            # In-model random draws (Gumbel noise, dropout) from a stream of their own on every process.
            seed_model_stream(cfg.seed, self.dist.rank)
        self.limits = RunLimits(tc)
        self.epoch = self.batch_in_epoch = self.step = 0  # the run's position (a resume loads it)
        self.best_rsum = -math.inf
        # The validation of the step ``last.pt`` is at is still to run: a signal stopped the run before it.
        self.validation_due = False
        # Read from this module's clock, as the loop's own step, validation and checkpoint timings are.
        self.timing = RunTimes(time.perf_counter)
        self._bar = None  # the terminal's bar while fit() runs (None: not a terminal, or not rank 0)
        self._logged_at = (0, 0.0)  # (step, step time) of the last training log line
        self.records = RecordLog(run_dir, self.dist.is_main)
        self.history = self.records.history

    @property
    def train_seconds(self) -> float:
        """Seconds spent in ``fit`` over every session of the run (resumes add theirs)."""
        return self.timing.train_seconds

    def times(self) -> dict[str, Any]:
        """``train_seconds`` and its parts (:mod:`~patchword.train.times`), every session's."""
        return self.timing.report()

    @property
    def skipped_steps(self) -> int:
        """Steps skipped: the loss was not finite, or under ``amp_fp16`` the gradient scaler found inf / NaN
        gradients (read from the device: not in the hot path)."""
        return self.optim.skipped_steps

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The resumable state; every process must call it (it gathers their RNG states)."""
        return {
            "model": self.model.state_dict(),
            **self.optim.state_dict(),  # optimizer, scheduler, scaler
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "step": self.step,
            "best_rsum": self.best_rsum,
            "skipped_steps": self.skipped_steps,
            "train_seconds": self.train_seconds,
            "times": dict(self.timing.totals),
            "validation_due": self.validation_due,
            **rank_rng_states(self.dist),  # rng, rng_ranks, world_size
            "config": asdict(self.cfg),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if self.bf16 is not None:
            self.bf16.pull()
        self.optim.load_state_dict(state)
        self.epoch, self.batch_in_epoch, self.step = state["epoch"], state["batch_in_epoch"], state["step"]
        self.best_rsum, self.optim.skipped_steps = state["best_rsum"], state["skipped_steps"]
        self.timing.load(state)
        self.validation_due = bool(state.get("validation_due", False))
        if self.batch_in_epoch >= len(self._epoch_batches(self.epoch)):
            # Written at an epoch's last step by an older patchword (before the epoch rolled over and was
            # validated): continue as from the checkpoint this version writes there. The optimiser, just
            # loaded, has not stepped in this process: torch's warning about the order is moot.
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", message="Detected call of `lr_scheduler.step", category=UserWarning
                )
                self._next_epoch()
            self.validation_due = True
        processes = restore_rng(state, self.dist, self.cfg.seed, self.step)
        if processes is not None:
            _logger.warning(
                "resuming a %d-process run with %d processes: batches are unchanged, in-model random "
                "draws (Gumbel noise, dropout) continue from new streams",
                processes,
                self.dist.world_size,
            )

    def save_last(self, averaged: bool = False) -> None:
        if not averaged:  # the BatchNorm statistics of every process, as a validation averages them
            average_batch_norm_statistics(self.model, self.dist)
        state = self.state_dict()
        self.timing.saved = self.times() | {"train_seconds": state["train_seconds"]}
        started = time.perf_counter()
        if self.dist.is_main:
            atomic_save(state, self.run_dir / LAST_CHECKPOINT)
        # No process goes on before the file is there: one that reported a stop and exited would have
        # torchrun end rank 0 in the middle of the write.
        self.dist.barrier()
        self.timing.totals["checkpoint"] += time.perf_counter() - started

    # ------------------------------------------------------------------ loop
    def fit(self) -> dict[str, Any]:
        """Train until ``epochs``, ``max_steps`` or ``time_budget_s``; returns the best dev metrics.

        Raises:
            TrainingInterrupted: SIGTERM / SIGINT arrived (after ``last.pt`` was written).
        """
        flag: dict[str, int] = {}
        with self.records.tracking(self.cfg), torch_threads(self.tc.num_threads), record_stop_signals(flag):
            return self._fit(flag)

    @property
    def finished(self) -> bool:
        """Nothing left to train or validate (a resume of a finished run only evaluates it again)."""
        return self._limit_reached() and not self.validation_due

    def _limit_reached(self) -> bool:
        return self.limits.reached(self.epoch, self.step, self.train_seconds)

    def _fit(self, flag: dict[str, int]) -> dict[str, Any]:
        self.timing.session_start = time.perf_counter()
        self._logged_at = (self.step, self.timing.totals["steps"])  # step_seconds: this session's steps only
        if self.validation_due:  # the signal that stopped the last session came before this validation
            self.validate(flag)
        # A resumed run that already got there. A new run takes its first step whatever the budget: one
        # spent before it (train.time_budget_s=1e-6) would leave no checkpoint to resume or evaluate.
        stop = self.step > 0 and self._limit_reached()
        bar_enabled = self.cfg.progress if self.dist.is_main else False
        planned = self.limits.planned_steps(len(self._epoch_batches(0)))  # every epoch has as many batches
        with terminal_bar(planned, "train", bar_enabled, initial=self.step, unit="step") as bar:
            self._bar = bar
            try:
                self._train_loop(flag, stop)
            finally:
                self._bar = None
        if self.limits.budget_stopped(self.epoch, self.step, self.train_seconds):
            spent = (self.tc.time_budget_s, self.step, self.train_seconds)
            _logger.info(
                "train.time_budget_s=%g spent: stopped at step %d (%.1f s of training; a new run always "
                "takes its first step)",
                *spent,
            )
        # what last.pt records (the fit ends with a save): a resume continues from exactly these
        times = self.times() if self.timing.saved is None else self.timing.saved
        counts = (self.step, self.epoch, self.skipped_steps)
        return fit_summary(self.best_rsum, *counts, times, self.dev_split.num_images)

    def _train_loop(self, flag: dict[str, int], stop: bool) -> None:
        while not stop:
            batches = self._epoch_batches(self.epoch)
            waiting = None  # when the wait for the next batch began; None: the loader's start-up (not timed)
            for batch in self._loader(batches):
                self.timing.step_begun = time.perf_counter() if waiting is None else waiting
                self._train_step(batch, len(batches))
                self.batch_in_epoch += 1
                self.step += 1
                if self._bar is not None:
                    self._bar.update(1)
                self.optim.decay_at(self.step)
                epoch_end = self.batch_in_epoch >= len(batches)
                if epoch_end:
                    self._next_epoch()
                # Decisions every process must take at the same step (a signal reaches one process).
                signalled, stop = self.dist.any("signum" in flag, self._limit_reached())
                due = self.limits.validates(self.step, epoch_end, stop)
                self.timing.end_step()  # the step ends here: validation is not its time
                if signalled:
                    # Stop now (pre-emption leaves seconds); this step's validation waits for the resume.
                    self.validation_due = due
                    self.save_last()
                    self._stop(flag)
                if due:
                    self.validate(flag)
                elif self.limits.saves(self.step):
                    self.save_last()
                if stop:
                    break
                waiting = time.perf_counter()

    def _stop(self, flag: dict[str, int]) -> NoReturn:
        """The stop every process takes together (each calls it), named by the signal this process received,
        else by the first rank's that did (a signal may reach one process only)."""
        received, signum, where = self.dist.all_gather_object(flag.get("signum")), flag.get("signum"), ""
        if signum is None:
            rank, signum = next((r, s) for r, s in enumerate(received) if s is not None)
            where = f"rank {rank} of {self.dist.world_size} received it"
        raise TrainingInterrupted(signum, self.step, self.run_dir / LAST_CHECKPOINT, self.resume_hint, where)

    def _next_epoch(self) -> None:
        self.epoch += 1
        self.batch_in_epoch = 0
        self.scheduler.step()

    def _epoch_batches(self, epoch: int) -> list[torch.Tensor]:
        """The global batches of ``epoch`` (the same in every process, whatever their number)."""
        n, size = self.train_split.num_captions, self.tc.batch_size
        return epoch_batches(n, size, self.cfg.seed, epoch)

    def _loader(self, batches: list[torch.Tensor]) -> Iterator[ShardBatch]:
        """This process's shards of the epoch's batches from ``batch_in_epoch`` on, on the device."""
        yield from shard_loader(
            self.cfg,
            self.train_split,
            batches,
            self.dist,
            self.device,
            augmenter=self.augmenter,
            epoch=self.epoch,
            first=self.batch_in_epoch,
            first_step=self.step,  # the step batch `first` is trained at (a resume starts mid-epoch)
            max_widths=max_text_widths(self.cfg.data, self.model.text_encoder),
        )

    def _align_scale(self, n_batches: int) -> float | torch.Tensor:
        """The weight of the alignment loss at this step (:mod:`~patchword.train.align_warmup`)."""
        return self._align(self.epoch, self.batch_in_epoch, n_batches)

    def _train_step(self, batch: ShardBatch, n_batches: int) -> None:
        tc = self.tc
        self.loss.model.train()
        scale = self._align_scale(n_batches)
        self.optimizer.zero_grad(set_to_none=True)
        hardest, global_warmup = self.epoch >= tc.hardest_after_epochs, self.step < tc.global_warmup_steps
        # [loss, align, ratio] of the global batch
        stats = self._step_modules.run(batch, hardest, global_warmup, scale, self.scaler)
        found_inf = (~torch.isfinite(stats[0])).float()  # the same verdict in every process
        done = self.step + 1  # steps done with this one: the count logs, dev records and checkpoints use
        skip_warning = "non-finite loss at step %d: step skipped (%d so far)"
        if self.optim.host_decides:
            # amp_fp16 / no fused optimiser: the step decision needs the value on the host
            if not bool(torch.isfinite(stats[0])):
                self.optim.skip()
                _logger.warning(skip_warning, done, self.skipped_steps)
            else:
                self._clip_and_step(None)
        else:
            self._clip_and_step(found_inf)
            self.optim.skipped += found_inf
        if tc.log_every and done % tc.log_every == 0 and self.dist.is_main:
            losses, grad_norm, skipped = self.optim.read_with(stats)  # one host sync
            previous_step, previous_time = self._logged_at
            now = self.timing.step_time()
            self._logged_at = (done, now)
            step_seconds = (now - previous_time) / max(1, done - previous_step)
            record = train_record(
                done, self.epoch, losses, self.optim, grad_norm, skipped, step_seconds, time.time()
            )
            _logger.info("step %d epoch %d loss %.4f", done, self.epoch, losses[0])
            if self._bar is not None:
                self._bar.set_postfix(epoch=self.epoch, loss=f"{losses[0]:.4f}", refresh=False)
            if not math.isfinite(losses[0]) and not self.optim.host_decides:  # (those warned above)
                _logger.warning(skip_warning, done, skipped)
            self._log(record)

    def _clip_and_step(self, found_inf: torch.Tensor | None) -> None:
        """Clip and step (:meth:`~patchword.train.optimiser.Optimiser.clip_and_step`; the fused optimiser
        skips the update on the device where ``found_inf`` is 1), then refresh the bfloat16 copy."""
        self.optim.clip_and_step(found_inf)
        if self.bf16 is not None:
            self.bf16.pull()

    # ------------------------------------------------------------------ validation
    def validate(self, flag: dict[str, int]) -> dict[str, float]:
        """Dev metrics under the run's evaluation protocol (the test's), saved in ``last.pt``; then the run
        stops if a signal arrived (``flag``, the loop's) in any process. One during a single process's
        evaluation ends it at once, the validation left due; the processes of a ``torchrun`` evaluate together
        (one leaving would strand the others in a collective), so there it is finished and saved first."""
        started = time.perf_counter()
        average_batch_norm_statistics(self.model, self.dist)  # every process evaluates with the same
        eval_cfg = replace(self.cfg.eval, coco_1k=False)  # the 1K folds are a test-split protocol
        where = {"device": self.device, "progress": self.cfg.progress if self.dist.is_main else False}
        try:
            with contextlib.nullcontext() if self.dist.enabled else stop_signals_raise(flag):
                metrics = evaluate(self.model, self.dev_split, eval_cfg, dist=self.dist, **where)
        except StopNow:
            self.timing.totals["validation"] += time.perf_counter() - started
            self.validation_due = True
            self.save_last(averaged=True)
            self._stop(flag)
        metrics.pop("cost")  # the test evaluation records it (summary.json); dev records stay flat
        position = (self.step, self.epoch, self.batch_in_epoch)
        self._log(dev_record(metrics, *position, time.time(), self.dev_split))
        self.validation_due = False
        said = (self.step, self.dev_split.num_images, metrics["rsum"], metrics["t2i_r1"], metrics["i2t_r1"])
        _logger.info("dev @ step %d (%d images): rsum %.1f (t2i R@1 %.1f, i2t R@1 %.1f)", *said)
        saving = time.perf_counter()
        self.timing.totals["validation"] += saving - started
        if metrics["rsum"] > self.best_rsum:
            self.best_rsum = metrics["rsum"]
            if self.dist.is_main:
                best = {"model": self.model.state_dict(), "metrics": metrics, "step": self.step}
                atomic_save({**best, "config": asdict(self.cfg)}, self.run_dir / BEST_CHECKPOINT)
            self.timing.totals["checkpoint"] += time.perf_counter() - saving
        self.save_last(averaged=True)
        if self.dist.any("signum" in flag)[0]:  # one after the evaluation (or in another process)
            self._stop(flag)
        return metrics

    def _log(self, record: dict[str, Any]) -> None:
        self.records.log(record)
