"""``train.text_width_multiple``: training batches whose caption and dense-caption ids are padded to a
multiple of N positions (16 by default when the step replays CUDA graphs), so that the step meets (and
records) fewer batch shapes (docs/distributed.md). Padding must not change what a step computes: every
family's encoders and matcher read the lengths, never the width (dropout aside, whose draws follow the
tensor's size)."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY_REGION_MODEL, TINY_RUN_32, TRAINING_FAMILIES, tiny_hf_laps_overrides
from patchword.config import apply_overrides
from patchword.data.batches import ShardBatch, pad_width
from patchword.runs.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = TRAINING_FAMILIES  # every family's training step


def test_pad_width_rounds_up_to_the_multiple_within_the_cap():
    ids = torch.tensor([[2, 5, 6, 3, 0], [2, 7, 3, 0, 0]])  # (2, 5)
    assert torch.equal(pad_width(ids, 1, 40), ids)
    assert torch.equal(pad_width(ids, 5, 40), ids)  # already a multiple: the same tensor
    padded = pad_width(ids, 4, 40)
    assert padded.shape == (2, 8) and torch.equal(padded[:, :5], ids) and not padded[:, 5:].any()
    assert pad_width(ids, 16, 12).shape == (2, 12)  # the cap wins
    assert torch.equal(pad_width(ids, 16, 3), ids)  # a cap below the batch's width never truncates


def _trainer(overrides: list[str], tmp_path):
    from patchword.train.runner import _build
    from patchword.train.trainer import Trainer

    cfg = apply_overrides(RunConfig(), [*overrides, f"data.cache_dir={tmp_path / 'cache'}"])
    data, model = _build(cfg, None)
    return Trainer(cfg, model, data.splits["train"], data.splits["dev"], tmp_path, tokenizer=data.tokenizer)


def _without_dropout(module: torch.nn.Module) -> None:
    """Dropout draws as many numbers as the tensor it drops has: a wider batch would draw others."""
    for m in module.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        for name in ("dropout_prob", "dropout"):  # transformers' SDPA and nn.MultiheadAttention's dropout
            if isinstance(getattr(m, name, None), float):
                setattr(m, name, 0.0)


def _loss_and_grads(trainer, batch: ShardBatch, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model = trainer.loss.model
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same in-model random stream (SEPS's Gumbel noise) for both batches
    loss, _ = trainer.loss(batch, True, False, 1.0)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _wider(batch: ShardBatch, extra: int, dense_extra: int) -> ShardBatch:
    pad = torch.nn.functional.pad
    return ShardBatch(
        **{
            **vars(batch),
            "ids": pad(batch.ids, (0, extra)),
            "dense_ids": None if batch.dense_ids is None else pad(batch.dense_ids, (0, dense_extra)),
        }
    )


def _assert_same_step(trainer, batch: ShardBatch) -> None:
    _without_dropout(trainer.loss.model)
    trainer.loss.model.train()
    loss, grads = _loss_and_grads(trainer, batch, seed=3)
    wide_loss, wide_grads = _loss_and_grads(trainer, _wider(batch, 7, 5), seed=3)
    assert torch.isfinite(loss) and loss != 0
    assert torch.allclose(wide_loss, loss, rtol=1e-12, atol=0), (float(wide_loss), float(loss))
    assert len(wide_grads) == len(grads) > 0
    for wide, grad in zip(wide_grads, grads, strict=True):
        assert torch.allclose(wide, grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_batch_padded_wider_trains_to_the_same_loss_and_gradients(family, tmp_path):
    trainer = _trainer([*FAMILIES[family], "precision=fp64"], tmp_path)
    batch = next(iter(trainer._loader(trainer._epoch_batches(0))))
    assert (batch.dense_ids is not None) == family.startswith("seps")  # the dense pass is padded too
    _assert_same_step(trainer, batch)


def test_a_hugging_face_batch_padded_wider_trains_to_the_same_loss_and_gradients(
    tiny_hf, laps_dataset, tmp_path
):
    overrides = tiny_hf_laps_overrides(tiny_hf, laps_dataset, tmp_path)
    trainer = _trainer([*overrides, "precision=fp64", "data.size_augment=false"], tmp_path)
    batch = next(iter(trainer._loader(trainer._epoch_batches(0))))
    batch = ShardBatch(**{**vars(batch), "ids": batch.ids[:, :8], "lens": batch.lens.clamp(max=8)})
    batch.lens_all = batch.lens  # one process: the shard is the batch; 8 + 7 fits BERT's 16 positions
    _assert_same_step(trainer, batch)


def _widths(overrides: list[str], tmp_path, dense: bool = True) -> tuple[set[int], set[int], list]:
    """The caption widths, dense-caption widths and caption lengths of a run's first epoch's batches."""
    trainer = _trainer(overrides, tmp_path)
    batches = list(trainer._loader(trainer._epoch_batches(0)))
    dense_widths = {b.dense_ids.shape[1] for b in batches} if dense else set()
    return {b.ids.shape[1] for b in batches}, dense_widths, [b.lens for b in batches]


def test_the_trainer_pads_each_batch_to_the_multiple_and_keeps_its_lengths(tmp_path):
    run = [*TINY_RUN_32, "model.seps.variant=paper", "train.batch_size=4", "data.max_dense_len=30"]
    widths, dense, lens = _widths(run, tmp_path / "a")
    assert len(widths) >= 2  # what the test is about: batches of different widths
    padded, padded_dense, padded_lens = _widths([*run, "train.text_width_multiple=8"], tmp_path / "b")
    assert padded == {-(-w // 8) * 8 for w in widths} and len(padded) < len(widths)
    assert padded_dense == {min(-(-w // 8) * 8, 30) for w in dense}  # capped at data.max_dense_len
    assert all(torch.equal(a, b) for a, b in zip(lens, padded_lens, strict=True))


def test_the_multiple_is_16_when_the_step_replays_cuda_graphs_and_1_otherwise():
    from patchword.errors import ConfigError
    from patchword.train.validate import check_config

    def resolved(*overrides: str) -> int:
        cfg = apply_overrides(RunConfig(), ["device=cpu", *overrides])
        check_config(cfg)  # checked before anything is written
        return cfg.train.width_multiple()

    graphs = ("train.compile=true", "train.compile_scope=step")
    assert resolved() == 1
    assert resolved(*graphs) == 1
    assert resolved(*graphs, "train.compile_mode=reduce-overhead") == 16
    assert resolved(*graphs, "train.compile_mode=max-autotune") == 16
    assert resolved(*graphs, "train.compile_mode=max-autotune-no-cudagraphs") == 1
    assert resolved("train.text_width_multiple=8") == 8
    assert resolved(*graphs, "train.compile_mode=reduce-overhead", "train.text_width_multiple=1") == 1
    with pytest.raises(ConfigError) as err:
        resolved("train.text_width_multiple=-1")
    assert err.value.key == "train.text_width_multiple"


def test_the_padding_stops_at_the_data_caps_and_the_text_encoders_positions(tiny_hf, laps_dataset, tmp_path):
    # BERT here has 16 positions: a multiple of 32 gives the captions' cap of 12 (augmented captions),
    # and 16 where the cap is above BERT's positions (a Trainer built without the run's checks)
    trainer = _trainer(
        [*tiny_hf_laps_overrides(tiny_hf, laps_dataset, tmp_path), "train.text_width_multiple=32"], tmp_path
    )
    assert {b.ids.shape[1] for b in trainer._loader(trainer._epoch_batches(0))} == {12}
    trainer.cfg.data.max_caption_len = 20
    assert {b.ids.shape[1] for b in trainer._loader(trainer._epoch_batches(0))} == {16}
    # the GRU has no limit of its own: the data caps (captions 40 words, the default)
    regions = [*TINY_RUN_32, *TINY_REGION_MODEL, "model.matcher=scan", "train.text_width_multiple=64"]
    widths, _, _ = _widths(regions, tmp_path / "gru", dense=False)
    assert widths == {40}
