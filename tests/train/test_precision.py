"""``precision=fp64``: float64 weights and ops from the first step to the last evaluation, kept by
checkpoints, ``--resume`` and :func:`patchword.runs.load_run`; the amp precisions keep fp32 weights."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from conftest import TINY_RUN_32, tiny_model
from patchword.checkpoint import load_checkpoint
from patchword.config import apply_overrides
from patchword.errors import ConfigError
from patchword.precision import autocast_context, weight_dtype
from patchword.runs.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [
    *TINY_RUN_32,
    "precision=fp64",
]


def test_weight_dtype_and_autocast_of_every_precision():
    cpu = torch.device("cpu")
    assert weight_dtype("fp64") == torch.float64
    assert {weight_dtype(p) for p in ("fp32", "amp_bf16", "amp_fp16")} == {torch.float32}
    assert isinstance(autocast_context("fp32", cpu), nullcontext)
    assert isinstance(autocast_context("fp64", cpu), nullcontext)
    with autocast_context("amp_bf16", cpu):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="fp128"):
        weight_dtype("fp128")


def test_an_unknown_precision_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match="precision"):
        apply_overrides(RunConfig(), ["precision=fp128"])


def test_encode_images_casts_pixels_to_the_encoder_dtype():
    model = tiny_model(["a", "b"]).double()
    images = torch.rand(2, 3, 32, 32)  # float32, as every dataset yields them
    tokens = model.encode_images(images)
    assert tokens.dtype == torch.float64
    reference = model.float().encode_images(images)
    torch.testing.assert_close(tokens.float(), reference, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The synthetic scenes' cache of this module's runs (never ``~/.cache/patchword``)."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def fp64_run(tmp_path_factory, cache):
    from patchword.train.runner import train_run

    root = tmp_path_factory.mktemp("fp64")
    args = [*TINY, f"output_dir={root}", f"data.cache_dir={cache}", "name=r", "train.max_steps=6"]
    return root / "r", train_run(apply_overrides(RunConfig(), args))


def test_an_fp64_run_trains_saves_and_loads_in_float64(fp64_run):
    from patchword.runs import load_run

    run_dir, summary = fp64_run
    assert summary["steps"] == 6
    saved = load_checkpoint(run_dir / "last.pt")["model"]
    floats = {k: v for k, v in saved.items() if v.is_floating_point()}
    assert floats and all(v.dtype == torch.float64 for v in floats.values())
    loaded = load_run(run_dir, checkpoint="last.pt")
    state = loaded.model.state_dict()
    for name, value in floats.items():  # loaded without a round trip through float32
        assert state[name].dtype == torch.float64 and torch.equal(state[name], value), name


def test_an_fp64_resume_equals_the_uninterrupted_run(fp64_run, cache, tmp_path):
    from patchword.train.runner import resume_run, train_run

    run_dir, _ = fp64_run
    args = [*TINY, f"output_dir={tmp_path}", f"data.cache_dir={cache}", "name=half", "train.max_steps=3"]
    cfg = apply_overrides(RunConfig(), args)
    train_run(cfg)
    assert resume_run(tmp_path / "half", ["train.max_steps=6"])["steps"] == 6
    a = load_checkpoint(run_dir / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "half" / "last.pt")["model"]
    for name, value in a.items():
        assert torch.equal(value, b[name]), name
