"""``load_run(device=...)`` (and so ``create_model(run_dir, device=...)`` and the search ``Searcher``) takes
the devices the scoring helpers and the CLI take: ``auto`` (the CLI's default), and a GPU this machine lacks
is one ConfigError naming ``device`` before the run is read, not torch's error after the model is built."""

from __future__ import annotations

import pytest
import torch

from patchword import create_model
from patchword.errors import ConfigError
from patchword.runs import load_run

pytestmark = pytest.mark.usefixtures("one_thread")

NO_CUDA = r"^device: cuda(:0)? requested but CUDA is not available \(.*\); use device=auto or cpu$"


@pytest.fixture
def no_cuda(monkeypatch):
    """A machine without CUDA, whatever this one has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_a_missing_gpu_is_named_before_the_run_is_read(no_cuda, tmp_path):
    """Old code: "AssertionError: Torch not compiled with CUDA enabled" (a missing run: MissingFileError)."""
    with pytest.raises(ConfigError, match=NO_CUDA):
        load_run(tmp_path / "no-such-run", device="cuda")
    with pytest.raises(ConfigError, match=NO_CUDA):
        load_run(tmp_path / "no-such-run", device=torch.device("cuda", 0))


def test_auto_loads_on_the_cpu_without_a_gpu(no_cuda, trained_tiny_run):
    """Old code: "RuntimeError: Expected one of cpu, cuda, ipu, ... device type at start of device string:
    auto", from load_run and from create_model of a saved run."""
    run = load_run(trained_tiny_run, device="auto")
    assert run.device == torch.device("cpu")
    assert {p.device.type for p in run.model.parameters()} == {"cpu"}
    model = create_model(str(trained_tiny_run), device="auto")
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    with pytest.raises(ConfigError, match=NO_CUDA):
        create_model(str(trained_tiny_run), device="cuda")
