"""The pieces of the multi-process training step, in one process: loss shares that sum to the batch loss,
the pair-chunked SEPS step (same gradients as the unchunked one), image augmentation seeded per sample
(the same in any worker process), DataLoader workers, and ``python -m patchword``."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import TINY_MODEL_32, trainer_losses
from patchword.config import apply_overrides
from patchword.data.pipeline import FileImages, SelectedImages, load_images, train_image_seeds
from patchword.distributed import launch_info, shard_bounds
from patchword.losses import CMCLoss, HingeLoss, RatioLoss
from patchword.matching import build_matcher
from patchword.runs.config import RunConfig
from patchword.train.step import matcher_rows
from stall_support import HANG_GUARD_S

pytestmark = pytest.mark.usefixtures("one_thread")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------- shares


@pytest.mark.parametrize("hardest", [False, True])
def test_hinge_shares_of_a_partition_sum_to_the_batch_loss(hardest):
    sims = torch.randn(7, 7, generator=_gen(), dtype=torch.float64, requires_grad=True)
    img_ids = torch.tensor([0, 1, 1, 2, 3, 4, 4])  # images repeated in the batch are not negatives
    ignore = torch.zeros(7, 7, dtype=torch.bool)
    ignore[0, 5] = ignore[3, 1] = True
    loss = HingeLoss(margin=0.2)
    full = loss(sims, img_ids, ignore, hardest)
    (g_full,) = torch.autograd.grad(full, sims)
    shares = [loss(sims, img_ids, ignore, hardest, queries=slice(lo, hi)) for lo, hi in shard_bounds(7, 3)]
    total = sum(shares)
    (g_shares,) = torch.autograd.grad(total, sims)
    assert total.item() == pytest.approx(full.item(), rel=1e-12)
    assert torch.allclose(g_shares, g_full, atol=1e-12)
    assert all(s.item() > 0 for s in shares)


def test_cmc_shares_sum_to_the_batch_loss():
    img = torch.randn(6, 5, generator=_gen(1), dtype=torch.float64, requires_grad=True)
    txt = torch.randn(6, 5, generator=_gen(2), dtype=torch.float64, requires_grad=True)
    cmc = CMCLoss(margin=0.2, sigma=0.05)
    full = cmc(img, txt, max_violation=True)
    total = sum(cmc(img, txt, None, True, queries=slice(lo, hi)) for lo, hi in [(0, 2), (2, 6)])
    assert total.item() == pytest.approx(full.item(), rel=1e-12)
    g_full = torch.autograd.grad(full, (img, txt))
    g_total = torch.autograd.grad(total, (img, txt))
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(g_full, g_total, strict=True))


def test_ratio_loss_from_ratios_is_the_loss_of_the_decisions():
    masks = [torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([[1.0, 0.0], [0.0, 0.0]])]
    for mode in RatioLoss.MODES:
        loss = RatioLoss(0.4, mode=mode)
        assert float(loss.from_ratios(torch.tensor([0.5, 0.25]))) == pytest.approx(float(loss(masks)))


def test_shard_bounds_cover_the_batch_in_rank_order():
    assert shard_bounds(9, 2) == [(0, 5), (5, 9)]
    assert shard_bounds(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert shard_bounds(2, 3) == [(0, 1), (1, 2), (2, 2)]


def test_launch_info_reads_torchrun_and_slurm():
    assert launch_info({}).world_size == 1
    info = launch_info({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (info.rank, info.world_size, info.local_rank, info.launcher) == (3, 4, 1, "torchrun")
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):
        launch_info(slurm)
    info = launch_info({**slurm, "MASTER_ADDR": "node1", "MASTER_PORT": "29500"})
    assert (info.rank, info.world_size, info.local_rank, info.launcher) == (5, 8, 1, "slurm")
    assert launch_info({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}).world_size == 1  # one sbatch task


# ------------------------------------------------------------------------------------- chunked step


# float64: exact to rounding; float32 (the default precision): the same one step, to float32 rounding
_TOLERANCE = {torch.float64: (1e-12, 1e-10), torch.float32: (1e-5, 1e-4)}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    ("variant", "pairing"), [("code", "image"), ("paper", "image"), ("code", "caption"), ("paper", None)]
)
def test_pair_chunked_step_has_the_unchunked_gradients(variant, pairing, dtype):
    torch.manual_seed(0)
    options = {"gumbel": False} if variant == "paper" else {}
    matcher = (
        build_matcher(
            "seps",
            embed_dim=16,
            num_patches=16,
            has_cls=True,
            variant=variant,
            dense_pairing=pairing or "image",
            use_dense=pairing is not None,
            **options,
        )
        .to(dtype)
        .train()
    )
    g = _gen(3)
    img = torch.randn(5, 17, 16, generator=g, dtype=dtype, requires_grad=True)
    caps = torch.randn(7, 9, 16, generator=g, dtype=dtype, requires_grad=True)
    lens = torch.tensor([9, 4, 6, 9, 3, 7, 5])
    dense = dense_lens = None
    if pairing is not None:
        rows = 5 if pairing == "image" else 7
        dense = torch.randn(rows, 12, 16, generator=g, dtype=dtype, requires_grad=True)
        dense_lens = torch.randint(3, 13, (rows,), generator=g)
    ratio = RatioLoss(matcher.selection_ratio, mode=matcher.ratio_mode)
    leaves = [img, caps, *([dense] if dense is not None else []), *matcher.parameters()]

    def grads(chunk: int):
        out = matcher_rows(matcher, img, caps, lens, dense, dense_lens, chunk)
        loss = HingeLoss()(out.sims[:, :5]) + (out.sims**2).sum() + ratio(out.decisions)
        return out.sims.detach(), torch.autograd.grad(loss, leaves, allow_unused=True)

    sims_tol, grad_tol = _TOLERANCE[dtype]
    sims, full = grads(0)
    for chunk in (2, 3):
        sims_c, chunked = grads(chunk)
        assert torch.allclose(sims_c, sims, atol=sims_tol)
        for a, b in zip(full, chunked, strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                assert torch.allclose(a, b, rtol=grad_tol, atol=grad_tol)


def test_pair_chunked_training_equals_unchunked(tmp_path):
    from patchword.train.runner import train_run

    def losses(name, *extra):
        cfg = apply_overrides(RunConfig(), [*_TINY, f"output_dir={tmp_path}", f"name={name}", *extra])
        cfg.data.cache_dir = str(tmp_path / "cache")
        train_run(cfg)
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in records if r["split"] == "train"]

    # The chunked step sums the same terms in another order. In float32 AdamW turns that rounding noise
    # into weight differences that flip top-K choices within a few steps, by an amount that depends on
    # the CPU's kernels; in float64 the 6 steps agree to 2e-15 (measured, AMD EPYC and Intel Xeon).
    # test_pair_chunked_step_has_the_unchunked_gradients compares one float32 step's gradients.
    plain = losses("plain", "precision=fp64")
    chunked = losses("chunked", "precision=fp64", "train.pair_chunk=5")
    assert len(plain) == 6 and plain == pytest.approx(chunked, rel=1e-9)


_TINY = [
    "data.num_train=12",
    "data.num_dev=6",
    "data.num_test=6",
    *TINY_MODEL_32,
    "model.seps.variant=code",
    "train.batch_size=16",
    "train.max_steps=6",
    "train.log_every=1",
    "train.align_warmup_epochs=0",
    "eval.max_memory_mb=1",
]


# ------------------------------------------------------------------------------------- data loading


def _images(tmp_path, n=3):
    paths = []
    rng = np.random.default_rng(0)
    for i in range(n):
        path = tmp_path / f"{i}.png"
        Image.fromarray((rng.random((40, 48, 3)) * 255).astype(np.uint8)).save(path)
        paths.append(str(path))
    return FileImages(paths, image_size=16)


def test_image_augmentation_is_seeded_per_image(tmp_path):
    images = _images(tmp_path)
    seeds = train_image_seeds(0, step=7, positions=[0, 1, 2])
    batch = load_images(images, torch.tensor([0, 1, 2]), train=True, seeds=seeds)
    # the same image with the same seed in another batch (another process, another worker) is the same
    alone = load_images(images, torch.tensor([2]), train=True, seeds=seeds[2:])
    assert torch.equal(batch[2], alone[0])
    again = load_images(
        SelectedImages(images, torch.tensor([2, 1, 0])), torch.tensor([2]), train=True, seeds=seeds[:1]
    )
    assert torch.equal(batch[0], again[0])
    other = load_images(images, torch.tensor([0, 1, 2]), train=True, seeds=train_image_seeds(0, 8, [0, 1, 2]))
    assert not torch.equal(batch, other)  # another step, other crops


def test_dataloader_workers_load_the_same_batches(laps_dataset, tmp_path, monkeypatch):
    from patchword.train.runner import train_run

    paths = laps_dataset
    workers_used = []

    class Recording(torch.utils.data.DataLoader):
        def __init__(self, *args, **kwargs):
            workers_used.append(kwargs.get("num_workers", 0))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(torch.utils.data, "DataLoader", Recording)

    def losses(name, workers):
        cfg = apply_overrides(
            RunConfig(),
            [
                *[a for a in _TINY if not a.startswith(("data.num_", "data.synthetic_"))],
                "data.dataset=laps",
                f"data.root={paths['root']}",
                f"data.image_root={paths['image_root']}",
                f"data.dense_train={paths['dense_train']}",
                f"data.dense_test={paths['dense_test']}",
                "data.dev_from_train=2",
                "data.image_size=32",
                "train.batch_size=4",
                "train.max_steps=3",
                f"data.num_workers={workers}",
                f"output_dir={tmp_path}",
                f"name={name}",
            ],
        )
        train_run(cfg)
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in records if r["split"] == "train"]

    assert losses("workers", 2) == losses("in_process", 0)  # the same batches, the same arithmetic
    assert min(workers_used) == 0 and max(workers_used) >= 1  # image files: decoded in worker processes


def test_python_dash_m_patchword_help():
    proc = subprocess.run(
        [sys.executable, "-m", "patchword", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "train" in proc.stdout and "eval" in proc.stdout


def test_compile_flag_compiles_the_encoders_and_matcher(tmp_path, monkeypatch):
    """``train.compile`` goes through ``nn.Module.compile``; dynamo's eager backend keeps the test fast
    (the GPU default, inductor, generates kernels). One training step, compiled and not: the encoders and
    the matcher (``train.compile_scope=modules``) or the whole training loss (``step``), in
    ``train.compile_mode``."""
    compiled, modes = [], []
    original = torch.compile

    def eager_compile(fn, *args, **kwargs):
        compiled.append(type(getattr(fn, "__self__", fn)).__name__)
        modes.append(kwargs.pop("mode", None))
        return original(fn, *args, **{**kwargs, "backend": "eager"})

    monkeypatch.setattr(torch, "compile", eager_compile)

    def losses(*extra):
        return trainer_losses([*_TINY, *extra], tmp_path, steps=1)

    plain = losses()
    assert not compiled
    assert losses("train.compile=true") == pytest.approx(plain, rel=1e-5)
    assert sorted(compiled) == sorted(["TinyViT", "TinyTextTransformer", "SEPSMatcher"])
    assert modes == [None] * 3
    compiled.clear()
    modes.clear()
    step = ("train.compile=true", "train.compile_scope=step", "train.compile_mode=max-autotune-no-cudagraphs")
    assert losses(*step) == pytest.approx(plain, rel=1e-5)
    assert (compiled, modes) == (["ShardLoss"], ["max-autotune-no-cudagraphs"])  # the loss alone, one graph


# ------------------------------------------------------------------------------------- CPU scoring


def test_queue_workers_take_blocks_as_they_free_up():
    """A worker held up in its first block takes no other: the free worker takes every other block from
    the shared queue (a fixed share per worker would leave blocks waiting for the held one). No clock
    decides: the held worker waits until the other has taken the last block."""
    import threading

    from patchword.eval.engine.workers import in_workers

    done, lock = [], threading.Lock()
    slow, drained = {}, threading.Event()

    def fn(item: int) -> None:
        me = threading.get_ident()
        with lock:
            slow.setdefault("thread", me)  # the thread that took the first item is the slow one
            done.append((item, me))
            if len(done) == 20:
                drained.set()
        if me == slow["thread"] and not drained.wait(timeout=HANG_GUARD_S):
            pytest.fail(
                f"hang guard: the other worker did not take the remaining blocks in {HANG_GUARD_S:g} s"
            )

    in_workers(2, range(20), fn)
    assert sorted(item for item, _ in done) == list(range(20))  # every block exactly once
    assert sum(me == slow["thread"] for _, me in done) == 1  # the held worker took no block but its first


@pytest.mark.parametrize("pairing", ["image", "caption"])
def test_queue_workers_score_exactly_like_one_thread_of_control(pairing):
    from patchword.eval import score_matrix, two_stage_scores
    from patchword.eval.engine import SEPSEngine

    torch.manual_seed(0)
    matcher = build_matcher(
        "seps", embed_dim=16, num_patches=16, has_cls=True, variant="paper", dense_pairing=pairing
    ).eval()
    g = _gen(5)
    img = torch.randn(11, 17, 16, generator=g)
    caps = torch.randn(23, 9, 16, generator=g)
    lens = torch.randint(3, 10, (23,), generator=g)
    dense = torch.randn(11, 12, 16, generator=g)
    dense_lens = torch.randint(3, 13, (11,), generator=g)
    t2i = torch.arange(23) % 11

    def run(workers):
        engine = SEPSEngine(matcher, max_image_block=2, workers=workers)
        sims = score_matrix(
            matcher, img, caps, lens, dense, dense_lens, txt2img=t2i, engine=engine, max_memory_mb=64
        )
        assert engine.last_plan.details["workers"] == workers
        pairs = two_stage_scores(
            matcher, img, caps, lens, dense, dense_lens, txt2img=t2i, k=4, engine=engine, max_memory_mb=64
        )
        return sims, pairs.sims_i2t, pairs.sims_t2i

    for a, b in zip(run(1), run(3), strict=True):
        assert torch.allclose(a, b, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["train.pair_chunk=8", "model.matcher=vse"], "train.pair_chunk"),
        (["train.pair_chunk=-1"], "train.pair_chunk"),
        (["train.loss=infonce"], "train.loss"),
        (["dist_timeout_s=0"], "dist_timeout_s"),
        (["data.num_workers=-2"], "data.num_workers"),
        (["train.compile_scope=graph"], "train.compile_scope"),
        (["train.compile_mode=fast"], "train.compile_mode"),
        # CUDA graphs only where evaluation does not run the compiled modules
        (["train.compile=true", "train.compile_mode=reduce-overhead"], "train.compile_mode"),
        (["train.compile_scope=modules", "train.compile_mode=max-autotune"], "train.compile_mode"),
        # set without compiling: refused rather than silently ignored
        (["train.compile_mode=max-autotune-no-cudagraphs"], "train.compile_mode"),
        (["train.compile_scope=step"], "train.compile_scope"),
    ],
)
def test_new_config_keys_are_checked(overrides, key):
    from patchword.errors import ConfigError
    from patchword.train.validate import check_config, check_launch

    with pytest.raises(ConfigError) as err:
        check_config(apply_overrides(RunConfig(), ["device=cpu", *overrides]))
    assert err.value.key == key
    check_launch(apply_overrides(RunConfig(), ["train.batch_size=64"]), 4)  # 16 per process: fine
    with pytest.raises(ConfigError, match="64 captions do not split over 3 processes"):
        check_launch(apply_overrides(RunConfig(), ["train.batch_size=64"]), 3)


def test_the_whole_step_compiles_alone_in_one_process():
    from patchword.errors import ConfigError
    from patchword.train.validate import check_config, check_launch

    step = ["train.compile=true", "train.compile_scope=step", "train.compile_mode=reduce-overhead"]
    cfg = apply_overrides(RunConfig(), ["device=cpu", *step])
    check_config(cfg)  # CUDA graphs of the training loss alone: accepted
    check_launch(cfg, 1)
    with pytest.raises(ConfigError) as err:
        check_launch(cfg, 2)
    assert err.value.key == "train.compile_scope"
    check_launch(apply_overrides(RunConfig(), ["train.compile_scope=step"]), 2)  # not compiling: fine
    # a step-compiled run resumed without compiling (say on a CPU): its saved scope and mode are moot
    resumed = apply_overrides(RunConfig(), ["device=cpu", *step, "train.compile=false"])
    check_config(resumed, resuming=True)
    with pytest.raises(ConfigError, match="train.compile_scope=modules"):
        check_config(resumed)
