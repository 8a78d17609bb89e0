"""The training loop: hinge + ratio loss, official schedule, dev validation, atomic resumable checkpoints.

One loop for one process and for ``torchrun``'s many (one per device). Every process draws the same
global batches (a permutation seeded by (seed, epoch)) and loads its contiguous shard of each; the loss of
the global batch is split between the processes so that their sum, and the summed gradients, are exactly
those of a one-process run of the same global batch (:class:`ShardLoss`). Only rank 0 logs and writes.

Over 400 lines: the loop, its checkpoints, signals and validation share the trainer's state.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from patchword.checkpoint import atomic_save, load_checkpoint, rng_state, set_rng_state
from patchword.data.batches import ShardBatch, ShardedBatches
from patchword.data.pipeline import EncodedSplit, reads_files
from patchword.distributed import Distributed
from patchword.errors import ConfigError, Interrupted, ResumeHint
from patchword.eval.protocol import evaluate
from patchword.fileio import append_line
from patchword.model import RetrievalModel
from patchword.precision import autocast_context, weight_dtype
from patchword.progress import terminal_bar
from patchword.runs.config import CUDA_GRAPH_COMPILE_MODES, RunConfig
from patchword.runs.files import BEST_CHECKPOINT, LAST_CHECKPOINT
from patchword.train.augment import CaptionAugmenter
from patchword.train.cuda_graphs import CudaGraphSkips
from patchword.train.master_weights import BF16Copy
from patchword.train.step import ShardLoss, fused_supported, sync_batch_norm, usable_cpus, wrap_ddp
from patchword.train.trackers import open_trackers

__all__ = ["Trainer", "TrainingInterrupted", "torch_threads"]

_logger = logging.getLogger(__name__)

#: What ``Trainer._times`` adds up over every session (``last.pt`` keeps them as ``"times"``).
_TIME_KEYS = ("steps", "timed_steps", "validation", "checkpoint")


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


class TrainingInterrupted(Interrupted):
    """SIGTERM / SIGINT arrived; ``last.pt`` was written at ``step`` and the run can be resumed. The message
    says so and how to go on: ``resume`` (:class:`~patchword.errors.ResumeHint`), by default ``patchword
    train --resume``."""

    def __init__(self, signum: int, step: int, checkpoint: Path, resume: ResumeHint | None = None) -> None:
        self.step, self.checkpoint = step, checkpoint
        hint = resume or ResumeHint.resume("patchword train", checkpoint.parent)
        super().__init__(signum, hint.stopped(signum, step, checkpoint))


@contextlib.contextmanager
def on_stop_signals(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """``handler`` for SIGTERM / SIGINT during the block, the previous handlers back after it (from the main
    thread only: elsewhere signal handlers cannot be installed, and the block runs without)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def stop_raises(phase: dict[str, Any]) -> contextlib.AbstractContextManager[None]:
    """SIGTERM / SIGINT outside a training loop (which stops at a step, last.pt written) raise
    :class:`Interrupted` saying ``phase["then"]``: what is kept and how to go on (the runners update it as
    they go). SIGTERM's default action kills the process on the spot, leaving a half-made run directory
    behind and no ``interrupted:`` line."""

    def handler(signum, frame):  # noqa: ARG001
        if "signum" in phase:  # a second signal: the first is unwinding (and cleaning up) already
            return
        phase["signum"] = signum
        raise Interrupted(signum, f"{signal.Signals(signum).name} received {phase['then']}")

    return on_stop_signals(handler)


def record_stop_signals(flag: dict[str, int]) -> contextlib.AbstractContextManager[None]:
    """Record SIGTERM / SIGINT in ``flag["signum"]`` instead of dying mid-step (cluster pre-emption)."""
    return on_stop_signals(lambda signum, frame: flag.__setitem__("signum", signum))


# ------------------------------------------------------------------------------------------------- loss


class Trainer:
    """Trains ``model`` on ``train``, validates on ``dev``, writes checkpoints to ``run_dir``.

    Checkpoints: ``last.pt`` (everything needed to resume: model, optimizer, scheduler, scaler, position
    in the epoch, best dev rsum, RNG states of every process) after every validation, every
    ``train.checkpoint_every`` steps, at the end and when SIGTERM / SIGINT arrive; ``best.pt`` (model
    weights and their dev metrics) whenever dev rSum improves. Batches are a per-epoch permutation seeded
    by (seed, epoch), caption augmentation is seeded by (seed, step) and image augmentation by (seed,
    step, position in the batch), so a resumed run sees exactly the batches an uninterrupted run would
    have seen, whatever the number of processes.

    Validation follows every ``train.eval_every``-th step, each epoch's last step and the run's last step,
    once per step. A signal on such a step stops the run at once (pre-emption leaves seconds) with the
    validation recorded as due in ``last.pt``; the resume runs it first, so an interrupted run validates
    the same steps as an uninterrupted one. ``train.time_budget_s`` counts the training time of every
    session of the run (:attr:`train_seconds`: wall-clock, validation and checkpoints included); it is
    checked after each step, so a new run always trains at least one step (and validates and saves it).

    Times (every session's, kept in ``last.pt``): ``train_seconds`` the wall-clock time in :meth:`fit`;
    of it, ``step_time_seconds`` the training steps themselves (waiting for the batch, forward, backward,
    optimiser step; not a loader's start-up at an epoch's start), ``validation_seconds`` the dev
    evaluations and ``checkpoint_seconds`` the writes of ``last.pt`` / ``best.pt``. A training record's
    ``step_seconds`` is the step time per step since the previous record.

    Under ``torchrun`` (``dist`` with several processes) each process trains on its shard of every global
    batch; rank 0 alone logs, writes ``metrics.jsonl`` and the checkpoints. The optimiser step has no
    host synchronisation (a non-finite loss skips the step on the device through the fused optimiser);
    losses are read back only on logging steps.
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
        if train.num_captions < self.dist.world_size:
            raise ConfigError(
                "data", f"{train.num_captions} training captions for {self.dist.world_size} processes"
            )
        params = model.parameter_groups(tc.lr, tc.backbone_lr_mult)
        self.fused = fused_supported(self.device) and cfg.precision != "amp_fp16"
        extra = {"fused": True} if self.fused else {"foreach": True}
        self.optimizer = torch.optim.AdamW(params, weight_decay=tc.weight_decay, **extra)
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(
            self.optimizer, milestones=list(tc.lr_milestones), gamma=tc.lr_decay
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.precision == "amp_fp16")
        augment = cfg.data.size_augment if cfg.data.size_augment is not None else cfg.data.tokenizer == "bert"
        self.augmenter = None
        if augment:
            if tokenizer is None:
                raise ValueError("data.size_augment needs the tokenizer (Trainer(..., tokenizer=...))")
            self.augmenter = CaptionAugmenter(
                tokenizer, train, cfg.data.max_caption_len, cfg.data.max_dense_len, cfg.seed
            )
        if self.dist.enabled:
            sync_batch_norm(model, self.dist)
        # The model the step computes with: the model itself, or its bfloat16 copy (precision=bf16), whose
        # gradients go to the model's float32 master weights before the optimiser step.
        self.bf16 = BF16Copy(model) if cfg.precision == "bf16" else None
        step_model = self.bf16.module if self.bf16 is not None else model
        mode = None if tc.compile_mode == "default" else tc.compile_mode
        if tc.compile and tc.compile_scope == "modules":
            for module in (step_model.image_encoder, step_model.text_encoder, step_model.matcher):
                module.compile(mode=mode)
        self.loss = ShardLoss(step_model, cfg, self.dist)
        if tc.compile and tc.compile_scope == "step":  # encoders, matcher and loss: one graph
            self.loss.compile(mode=mode)
        # CUDA graph replays: each step starts a new generation, whose replays may overwrite the outputs of
        # the previous step's (its loss and statistics are read before the next step starts).
        wants_graphs = tc.compile and tc.compile_mode in CUDA_GRAPH_COMPILE_MODES
        self._cuda_graphs = wants_graphs and self.device.type == "cuda"
        self._graph_skips = CudaGraphSkips(tc.compile_mode, wants_graphs, self.device)
        self._scale_schedule: tuple[tuple[int, int], torch.Tensor] | None = None  # (epoch, batches), scales
        self.step_fn: nn.Module = self.loss
        if self.dist.enabled:
            self.step_fn = wrap_ddp(self.loss, self.device)
            if self.bf16 is not None:
                # DDP gave every process rank 0's weights, but in the copy, which the next refresh
                # overwrites: the master weights the optimiser steps must be rank 0's as well.
                with torch.no_grad():
                    for p in model.parameters():
                        torch.distributed.broadcast(p, src=0, group=self.dist.group)
                self.bf16.pull()
            # In-model random draws (Gumbel noise, dropout) from a stream of their own on every process.
            torch.manual_seed(cfg.seed * 1_000_003 + 7919 * (self.dist.rank + 1))
        self.epoch = 0
        self.batch_in_epoch = 0
        self.step = 0
        self.best_rsum = -math.inf
        # The validation of the step ``last.pt`` is at is still to run: a signal stopped the run before it.
        self.validation_due = False
        # Training time of the sessions before this one (from the checkpoint a resume loads) and the start
        # of this session's fit: train_seconds in checkpoints and summaries counts every session.
        self._seconds_before = 0.0
        self._fit_start: float | None = None
        # Seconds of every session in the training steps ("steps", over "timed_steps" of them: a checkpoint
        # of an older version records none of its steps), the validations and the checkpoint writes.
        self._times: dict[str, float] = dict.fromkeys(_TIME_KEYS, 0.0)
        self._step_begun = time.perf_counter()  # when the present step began waiting for its batch
        self._saved: dict[str, float] | None = None  # the times in the last.pt written last
        self._bar = None  # the terminal's bar while fit() runs (None: not a terminal, or not rank 0)
        self._skipped = torch.zeros((), device=self.device)
        self._grad_norm: torch.Tensor | None = None  # of the last step (read on logging steps only)
        self._logged_at = (0, 0.0)  # (step, step time) of the last training log line
        self.history: list[dict[str, Any]] = []
        self.trackers: list = []

    @property
    def train_seconds(self) -> float:
        """Seconds spent in ``fit`` over every session of the run (resumes add theirs)."""
        running = 0.0 if self._fit_start is None else time.perf_counter() - self._fit_start
        return self._seconds_before + running

    def _step_time(self) -> float:
        """Seconds in training steps over every session, the present step's so far included."""
        return self._times["steps"] + (time.perf_counter() - self._step_begun)

    def times(self) -> dict[str, float]:
        """``train_seconds`` and its parts (see the class docstring), every session's."""
        return {
            "train_seconds": self.train_seconds,
            "step_time_seconds": self._times["steps"],
            "timed_steps": int(self._times["timed_steps"]),
            "validation_seconds": self._times["validation"],
            "checkpoint_seconds": self._times["checkpoint"],
        }

    @property
    def skipped_steps(self) -> int:
        """Steps skipped: the loss was not finite, or under ``amp_fp16`` the gradient scaler found inf / NaN
        gradients (read from the device: not in the hot path)."""
        return int(self._skipped.item())

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self._skipped = torch.tensor(float(value), device=self.device)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The resumable state; every process must call it (it gathers their RNG states)."""
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
            "train_seconds": self.train_seconds,
            "times": dict(self._times),
            "validation_due": self.validation_due,
            "rng": rng_state(),
            "rng_ranks": self.dist.all_gather_object(rng_state()),
            "world_size": self.dist.world_size,
            "config": asdict(self.cfg),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if self.bf16 is not None:
            self.bf16.pull()
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.epoch, self.batch_in_epoch, self.step = state["epoch"], state["batch_in_epoch"], state["step"]
        self.best_rsum, self.skipped_steps = state["best_rsum"], state["skipped_steps"]
        # checkpoints written before train_seconds was kept hold none: their sessions count 0
        self._seconds_before = float(state.get("train_seconds", 0.0))
        # and those before the times were kept none (their steps are not timed steps)
        self._times = {key: float(state.get("times", {}).get(key, 0.0)) for key in _TIME_KEYS}
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
        ranks = state.get("rng_ranks") or [state["rng"]]
        if len(ranks) == self.dist.world_size:
            set_rng_state(ranks[self.dist.rank])
        else:
            set_rng_state(state["rng"])
            torch.manual_seed(self.cfg.seed * 1_000_003 + 7919 * (self.dist.rank + 1) + self.step)
            _logger.warning(
                "resuming a %d-process run with %d processes: batches are unchanged, in-model random "
                "draws (Gumbel noise, dropout) continue from new streams",
                len(ranks),
                self.dist.world_size,
            )

    def resume(self, path: str | Path) -> None:
        self.load_state_dict(load_checkpoint(path, map_location=self.device))
        _logger.info(
            "resumed from %s at epoch %d, batch %d, step %d", path, self.epoch, self.batch_in_epoch, self.step
        )

    def save_last(self) -> None:
        state = self.state_dict()
        self._saved = self.times() | {"train_seconds": state["train_seconds"]}
        started = time.perf_counter()
        if self.dist.is_main:
            atomic_save(state, self.run_dir / LAST_CHECKPOINT)
        self._times["checkpoint"] += time.perf_counter() - started

    # ------------------------------------------------------------------ loop
    def fit(self) -> dict[str, Any]:
        """Train until ``epochs``, ``max_steps`` or ``time_budget_s``; returns the best dev metrics.

        Raises:
            TrainingInterrupted: SIGTERM / SIGINT arrived (after ``last.pt`` was written).
        """
        flag: dict[str, int] = {}
        if self.dist.is_main and self.tc.report_to:
            self.trackers = open_trackers(
                list(self.tc.report_to),
                self.run_dir,
                asdict(self.cfg),
                wandb_project=self.tc.wandb_project,
                wandb_mode=self.tc.wandb_mode,
            )
        try:
            with torch_threads(self.tc.num_threads), record_stop_signals(flag):
                return self._fit(flag)
        finally:
            for tracker in self.trackers:
                tracker.close()
            self.trackers = []

    @property
    def finished(self) -> bool:
        """Nothing left to train or validate (a resume of a finished run only evaluates it again)."""
        return self._limit_reached() and not self.validation_due

    def _limit_reached(self) -> bool:
        """The epochs, ``max_steps`` or the time budget (counted over every session of the run) are spent."""
        tc = self.tc
        return bool(
            self.epoch >= tc.epochs
            or (tc.max_steps and self.step >= tc.max_steps)
            or (tc.time_budget_s and self.train_seconds >= tc.time_budget_s)
        )

    def _fit(self, flag: dict[str, int]) -> dict[str, Any]:
        self._fit_start = time.perf_counter()
        self._logged_at = (self.step, self._times["steps"])  # step_seconds: this session's steps only
        if self.validation_due:  # the signal that stopped the last session came before this validation
            self.validate()
        # A resumed run that already got there. A new run takes its first step whatever the budget: one
        # spent before it (train.time_budget_s=1e-6) would leave no checkpoint to resume or evaluate.
        stop = self.step > 0 and self._limit_reached()
        bar_enabled = self.cfg.progress if self.dist.is_main else False
        with terminal_bar(self._planned_steps(), "train", bar_enabled, initial=self.step, unit="step") as bar:
            self._bar = bar
            try:
                self._train_loop(flag, stop)
            finally:
                self._bar = None
        tc = self.tc
        other_limit = self.epoch >= tc.epochs or (tc.max_steps and self.step >= tc.max_steps)
        if tc.time_budget_s and self.train_seconds >= tc.time_budget_s and not other_limit:
            _logger.info(
                "train.time_budget_s=%g spent: stopped at step %d (%.1f s of training; a new run always "
                "takes its first step)",
                tc.time_budget_s,
                self.step,
                self.train_seconds,
            )
        times = self.times() if self._saved is None else self._saved
        return {
            # None before any validation (a resumed run that never validated): JSON has no -Infinity
            "best_dev_rsum": self.best_rsum if math.isfinite(self.best_rsum) else None,
            "steps": self.step,
            "epochs_done": self.epoch,
            "skipped_steps": self.skipped_steps,
            # what last.pt records (the fit ends with a save): a resume continues from exactly these
            **times,
        }

    def _planned_steps(self) -> int:
        """The steps ``epochs`` and ``max_steps`` allow (a time budget may end the run sooner)."""
        steps = self.tc.epochs * len(self._epoch_batches(0))  # every epoch has the same number of batches
        return min(steps, self.tc.max_steps) if self.tc.max_steps else steps

    def _train_loop(self, flag: dict[str, int], stop: bool) -> None:
        tc = self.tc
        while not stop:
            batches = self._epoch_batches(self.epoch)
            waiting = None  # when the wait for the next batch began; None: the loader's start-up (not timed)
            for batch in self._loader(batches):
                self._step_begun = time.perf_counter() if waiting is None else waiting
                self._train_step(batch, len(batches))
                self.batch_in_epoch += 1
                self.step += 1
                if self._bar is not None:
                    self._bar.update(1)
                if self.step in tc.lr_milestone_steps:
                    for group in self.optimizer.param_groups:
                        group["lr"] *= tc.lr_decay
                epoch_end = self.batch_in_epoch >= len(batches)
                if epoch_end:
                    self._next_epoch()
                # Decisions every process must take at the same step (a signal reaches one process).
                signalled, stop = self.dist.any("signum" in flag, self._limit_reached())
                due = epoch_end or stop or bool(tc.eval_every and self.step % tc.eval_every == 0)
                self._times["steps"] = self._step_time()  # the step ends here: validation is not its time
                self._times["timed_steps"] += 1
                if signalled:
                    # Stop now (pre-emption leaves seconds); this step's validation waits for the resume.
                    self.validation_due = due
                    self.save_last()
                    signum = flag.get("signum", signal.SIGTERM)
                    checkpoint = self.run_dir / LAST_CHECKPOINT
                    raise TrainingInterrupted(signum, self.step, checkpoint, self.resume_hint)
                if due:
                    self.validate()
                elif tc.checkpoint_every and self.step % tc.checkpoint_every == 0:
                    self.save_last()
                if stop:
                    break
                waiting = time.perf_counter()

    def _next_epoch(self) -> None:
        self.epoch += 1
        self.batch_in_epoch = 0
        self.scheduler.step()

    def _epoch_batches(self, epoch: int) -> list[torch.Tensor]:
        """The global batches of ``epoch`` (the same in every process, whatever their number)."""
        gen = torch.Generator().manual_seed(self.cfg.seed * 100003 + epoch)
        perm = torch.randperm(self.train_split.num_captions, generator=gen)
        batches = list(perm.split(self.tc.batch_size))
        # A one-caption batch has no negatives (and one smaller than the number of processes leaves one
        # without samples): fold it into the previous batch.
        if len(batches) > 1 and batches[-1].numel() < max(2, self.dist.world_size):
            batches[-2] = torch.cat([batches[-2], batches.pop()])
        return batches

    def _loader(self, batches: list[torch.Tensor]) -> Iterator[ShardBatch]:
        """This process's shards of the epoch's batches from ``batch_in_epoch`` on, on the device; image
        files are decoded by ``data.num_workers`` worker processes into pinned memory."""
        shards = ShardedBatches(
            self.train_split,
            batches,
            self.dist.shard,
            first=self.batch_in_epoch,
            first_step=self.step,  # the step batch `first` is trained at (a resume starts mid-epoch)
            seed=self.cfg.seed,
            text=self.augmenter,
            mask_false_negatives=self.tc.mask_false_negatives,
            width_multiple=self.tc.width_multiple(),
            max_widths=self._max_text_widths(),
        )
        workers = min(self.cfg.data.num_workers, usable_cpus()) if reads_files(self.train_split.images) else 0
        pin = self.device.type == "cuda"
        loader = torch.utils.data.DataLoader(
            shards,
            batch_size=None,
            num_workers=workers,
            pin_memory=pin,
            prefetch_factor=2 if workers else None,
            # A generator of its own: a DataLoader draws its base seed from the global RNG when it starts
            # iterating, which happens at each epoch start and again at a resume. Drawn from the global RNG,
            # that shifts the in-model random stream (Gumbel noise, dropout) of a resumed run by one draw.
            generator=torch.Generator().manual_seed(self.cfg.seed * 100003 + self.epoch),
        )
        for batch in loader:
            yield batch.to(self.device)

    def _max_text_widths(self) -> tuple[int, int]:
        """The widest ``train.text_width_multiple`` may pad (captions, dense captions): the data's caps,
        and no more positions than the text encoder has (a GRU has no limit)."""
        dc, limit = self.cfg.data, getattr(self.model.text_encoder, "max_len", None)
        caps = (dc.max_caption_len, dc.max_dense_len)
        return caps if not isinstance(limit, int) else (min(caps[0], limit), min(caps[1], limit))

    def _align_scale(self, n_batches: int) -> float | torch.Tensor:
        """The weight of the alignment loss at this step: the official warm-up grows it linearly over the
        first epoch(s), then 1. Compiled (``train.compile``) it is a 0-d tensor on the device, one entry of
        this epoch's schedule (uploaded once per epoch): a Python float that changes every step would make
        the compiler specialise on it (a recompilation) and then take it as a host scalar input, which
        keeps that graph, the one every later step reuses, from being replayed as a CUDA graph."""
        warmup = self.tc.align_warmup_epochs

        def scale(i: int) -> float:
            if self.epoch >= warmup:
                return 1.0
            return min(1.0, (self.epoch * n_batches + i) / (warmup * n_batches))

        if not self.tc.compile:
            return scale(self.batch_in_epoch)
        key = (self.epoch, n_batches)
        if self._scale_schedule is None or self._scale_schedule[0] != key:
            # the losses' dtype (float64 in an fp64 run): a float32 schedule would round the weight
            dtype = weight_dtype(self.cfg.precision)
            values = torch.tensor([scale(i) for i in range(n_batches)], dtype=dtype, device=self.device)
            self._scale_schedule = (key, values)
        return self._scale_schedule[1][self.batch_in_epoch]

    def _train_step(self, batch: ShardBatch, n_batches: int) -> None:
        tc = self.tc
        self.loss.model.train()
        scale = self._align_scale(n_batches)
        self.optimizer.zero_grad(set_to_none=True)
        if self._cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with autocast_context(self.cfg.precision, self.device):
            loss, stats = self.step_fn(
                batch, self.epoch >= tc.hardest_after_epochs, self.step < tc.global_warmup_steps, scale
            )
        self.scaler.scale(loss).backward()
        self._graph_skips.check()  # warns when more compiled graphs run without the CUDA graphs asked for
        if self.bf16 is not None:
            self.bf16.push_grads()
        stats = self.dist.all_reduce(stats)  # [loss, align, ratio] of the global batch
        found_inf = (~torch.isfinite(stats[0])).float()  # the same verdict in every process
        done = self.step + 1  # steps done with this one: the count logs, dev records and checkpoints use
        if self.scaler.is_enabled() or not self.fused:
            # amp_fp16 / no fused optimiser: the step decision needs the value on the host
            if not bool(torch.isfinite(stats[0])):
                self._skip(done)
            else:
                self._clip_and_step(None)
        else:
            self._clip_and_step(found_inf)
            self._skipped += found_inf
        if tc.log_every and done % tc.log_every == 0 and self.dist.is_main:
            loss_value, align, ratio = stats.tolist()
            previous_step, previous_time = self._logged_at
            now = self._step_time()
            self._logged_at = (done, now)
            record = {
                "split": "train",
                "step": done,
                "epoch": self.epoch,  # the epoch the step belongs to (0-based), as in dev records
                # the loss and its weighted parts, which add up to it (ShardLoss.forward)
                "loss": loss_value,
                "align": align,
                "ratio": ratio,
                "lr": self.optimizer.param_groups[0]["lr"],
                **{f"lr_{g['name']}": g["lr"] for g in self.optimizer.param_groups[1:] if "name" in g},
                "grad_norm": float(self._grad_norm) if self._grad_norm is not None else None,
                "skipped_steps": self.skipped_steps,
                "step_seconds": (now - previous_time) / max(1, done - previous_step),
                "time": time.time(),
            }
            _logger.info("step %d epoch %d loss %.4f", done, self.epoch, loss_value)
            if self._bar is not None:
                self._bar.set_postfix(epoch=self.epoch, loss=f"{loss_value:.4f}", refresh=False)
            if not math.isfinite(loss_value) and not (self.scaler.is_enabled() or not self.fused):
                # (the host-decided paths warned in _skip already)
                _logger.warning(
                    "non-finite loss at step %d: step skipped (%d so far)", done, self.skipped_steps
                )
            self._log(record)

    def _skip(self, step: int) -> None:
        """Skip step ``step`` (counted from 1, as logged) whose loss is not finite."""
        self._skipped += 1
        _logger.warning("non-finite loss at step %d: step skipped (%d so far)", step, self.skipped_steps)
        self.optimizer.zero_grad(set_to_none=True)

    def _clip_and_step(self, found_inf: torch.Tensor | None) -> None:
        """Clip to the global gradient norm (gradients are already summed over processes) and step; the
        fused optimiser skips the update on the device where ``found_inf`` is 1."""
        if self.tc.grad_clip:
            self.scaler.unscale_(self.optimizer)
            self._grad_norm = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), self.tc.grad_clip, foreach=True
            )
        if found_inf is not None:
            self.optimizer.found_inf = found_inf  # read by the fused AdamW kernel
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else None  # amp_fp16: synced anyway
        try:
            self.scaler.step(self.optimizer)
        finally:
            if found_inf is not None:
                del self.optimizer.found_inf
        self.scaler.update()
        if scale is not None and self.scaler.get_scale() < scale:
            # the scaler skipped the step (inf / NaN gradients) and backed its scale off: a skipped step
            self._skipped += 1
        if self.bf16 is not None:
            self.bf16.pull()

    # ------------------------------------------------------------------ validation
    def validate(self) -> dict[str, float]:
        """Dev metrics under the run's evaluation protocol (the one the test is reported with)."""
        started = time.perf_counter()
        eval_cfg = replace(self.cfg.eval, coco_1k=False)  # the 1K folds are a test-split protocol
        progress = self.cfg.progress if self.dist.is_main else False
        metrics = evaluate(
            self.model, self.dev_split, eval_cfg, device=self.device, progress=progress, dist=self.dist
        )
        metrics.pop("cost")  # the test evaluation records it (summary.json); dev records stay flat
        # the epoch the validated step belongs to, as in training records (after an epoch's last step
        # self.epoch has moved on to the next)
        epoch = self.epoch - 1 if self.batch_in_epoch == 0 and self.step > 0 else self.epoch
        record = {"split": "dev", "step": self.step, "epoch": epoch, **metrics, "time": time.time()}
        self._log(record)
        self.validation_due = False
        _logger.info(
            "dev @ step %d: rsum %.1f (t2i R@1 %.1f, i2t R@1 %.1f)",
            self.step,
            metrics["rsum"],
            metrics["t2i_r1"],
            metrics["i2t_r1"],
        )
        saving = time.perf_counter()
        self._times["validation"] += saving - started
        if metrics["rsum"] > self.best_rsum:
            self.best_rsum = metrics["rsum"]
            if self.dist.is_main:
                best = {"model": self.model.state_dict(), "metrics": metrics, "step": self.step}
                atomic_save({**best, "config": asdict(self.cfg)}, self.run_dir / BEST_CHECKPOINT)
            self._times["checkpoint"] += time.perf_counter() - saving
        self.save_last()
        return metrics

    def _log(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        if self.dist.is_main:
            append_line(self.run_dir / "metrics.jsonl", json.dumps(record))
            for tracker in self.trackers:
                tracker.log(record)
