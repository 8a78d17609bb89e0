"""A logging training step reads its losses, gradient norm and skipped-step count from the device in one
copy (it read them in three: ``stats.tolist()``, ``float(grad_norm)`` and ``skipped.item()``), checked on
the simulated accelerator."""

from __future__ import annotations

import torch

from conftest import TINY_RUN_32
from patchword.config import apply_overrides
from patchword.model import build_model
from patchword.runs.config import RunConfig
from patchword.testing.simulated_device import SimulatedDevice
from patchword.train.optimiser import Optimiser
from patchword.train.records import train_record


def _optimiser() -> Optimiser:
    cfg = apply_overrides(RunConfig(), list(TINY_RUN_32))
    return Optimiser(build_model(cfg.model, vocab_size=64), cfg, torch.device("cpu"))


def test_a_logging_step_reads_the_device_once():
    optim = _optimiser()
    with SimulatedDevice() as sim:
        stats = sim.to_device(torch.tensor([0.75, 0.25, 0.5]))
        optim.skipped = sim.to_device(torch.tensor(3.0))
        optim.grad_norm = sim.to_device(torch.tensor(1.5))
        before = sim.counts.syncs
        losses, grad_norm, skipped = optim.read_with(stats)
        assert sim.counts.syncs - before == 1, sim.counts.sync_sites
    assert (losses, grad_norm, skipped) == ([0.75, 0.25, 0.5], 1.5, 3)
    record = train_record(4, 0, losses, optim, grad_norm, skipped, 0.1, 7.0)
    assert (record["loss"], record["grad_norm"], record["skipped_steps"]) == (0.75, 1.5, 3)


def test_before_the_first_step_there_is_no_gradient_norm_and_float32_losses_read_exactly():
    optim = _optimiser()
    stats = torch.tensor([0.1, 0.2, 0.3])  # float32: the values its tolist() gives
    assert optim.read_with(stats) == (stats.tolist(), None, 0)
