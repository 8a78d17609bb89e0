"""The UCMFH step loop does not wait for the accelerator: counted on the simulated device
(:mod:`patchword.testing.simulated_device`). Before, every step waited 14 (InfoNCE) to 20 (HashNet)
times: finiteness checks of the batch and of the outputs, ``float(loss)`` three times, ``if not
torch.isfinite(loss)``, the batch and the InfoNCE targets built on the host and copied over, HashNet's
``bool(mask.any())``. Now an epoch waits twice (its order uploaded, its losses read for the record)
whatever its number of steps, and the weights are those of the CPU run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import patchword.hashing.trainer as trainer_module
from conftest import TINY_HASH
from patchword.config import load_config
from patchword.hashing import HashRunConfig
from patchword.hashing.build import build_hashing_dataset, build_hashing_model
from patchword.testing.simulated_device import SimulatedDevice

pytestmark = pytest.mark.usefixtures("one_thread")

EPOCHS, STEPS_PER_EPOCH = 2, 4


def _fit(tmp_path: Path, monkeypatch, loss: str, device=None) -> tuple[dict, list]:
    """(weights after EPOCHS epochs, the epoch records) of a fresh tiny run on ``device``; nothing is
    written (the simulated device's tensors are not for files)."""
    cfg = load_config(
        HashRunConfig,
        None,
        [*TINY_HASH, "model.bits=16", "train.batch_size=16", f"train.loss={loss}", f"train.epochs={EPOCHS}"],
    )
    data = build_hashing_dataset(cfg.data)
    torch.manual_seed(0)
    model = build_hashing_model(cfg.model, data.image_dim, data.text_dim)
    records = []
    monkeypatch.setattr(trainer_module, "append_metrics", lambda run_dir, record: records.append(record))
    monkeypatch.setattr(trainer_module, "atomic_save", lambda state, path: None)
    trainer = trainer_module.HashTrainer(cfg, model, data, tmp_path, device=device)
    summary = trainer.fit()
    assert summary["steps"] == EPOCHS * STEPS_PER_EPOCH
    weights = {k: v.to("cpu") for k, v in model.state_dict().items()}
    return weights, [{k: v for k, v in r.items() if k != "elapsed_s"} for r in records]


@pytest.mark.parametrize("loss", ["infonce", "balanced", "hashnet"])
def test_the_step_loop_waits_for_the_device_twice_an_epoch(tmp_path, monkeypatch, loss):
    cpu_weights, cpu_records = _fit(tmp_path, monkeypatch, loss)
    sim = SimulatedDevice()
    original = trainer_module.HashTrainer.fit
    waits = {}

    def counted_fit(self):
        before = sim.counts.sync_sites.copy()
        out = original(self)
        waits.update(sim.counts.sync_sites - before)
        return out

    monkeypatch.setattr(trainer_module.HashTrainer, "fit", counted_fit)
    with sim:
        weights, records = _fit(tmp_path, monkeypatch, loss, device=sim.device)
    # the order's upload and the losses' read, once an epoch each (none per step)
    assert sum(waits.values()) == 2 * EPOCHS, waits
    assert all("hashing/trainer.py" in site for site in waits), waits
    assert records == cpu_records
    for name, value in cpu_weights.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=0, msg=name)
