"""Multi-process training and the GPU-ready step, measured (issue 13). Four subcommands:

``cpu``       1 vs 2 processes on this CPU (gloo): steps/s of ``patchword train`` and ``torchrun
              --nproc_per_node=2 -m patchword train`` on the same global batch, and the equivalence figures
              (largest relative difference of the per-step losses, of the final weights, and ``grads``
              at the final weights).
``grads``     the loss and gradient of one global batch from the same weights (a run's checkpoint) in 1
              process and in 2 (torchrun): what "a 2-process run equals a 1-process run" means step by step,
              free of the trajectories' divergence (rounding noise grows through hard top-K selection).
``memory``    peak memory of the SEPS training step (matcher forward + backward, ViT-224 shapes) at batch
              32 / 64 / 128, unchunked and pair-chunked (``train.pair_chunk``), each in a fresh process.
``gpu-step``  SEPS training steps/s at ViT-B/16 + BERT-base shapes (random initialisation, no download),
              batch 64, bfloat16 autocast: the trainer's step module and fused AdamW on one device.
``gpu-scoring`` exhaustive scoring of a Flickr30K-shaped (1000 x 5000) and a COCO-5K-shaped (5000 x 25000)
              matrix with ``score_matrix`` against the official per-caption loop
              (``patchword.testing.seps_reference_scores``) on a slice, extrapolated, on the same device.

Commands (docs/distributed.md): on an idle machine

    .venv/bin/python benchmarks/ddp_bench.py cpu --steps 60 --batch 64
    .venv/bin/python benchmarks/ddp_bench.py memory
    .venv/bin/python benchmarks/ddp_bench.py gpu-step --device cuda
    .venv/bin/python benchmarks/ddp_bench.py gpu-scoring --device cuda

Every subcommand takes ``--quick`` (tiny sizes, a smoke run on the CPU) and ``--json FILE``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


# ---------------------------------------------------------------------------------------------- cpu


def _train_losses(run: Path) -> tuple[list[float], list[float]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    return [r["loss"] for r in train], [r["time"] for r in train]


def cpu(args: argparse.Namespace) -> dict:
    import torch

    out = Path(args.out or tempfile.mkdtemp(prefix="ddp_bench_"))
    common = [
        "--config",
        str(ROOT / "configs" / "synthetic_seps_paper.yaml"),
        f"output_dir={out}",
        f"train.max_steps={args.steps}",
        "train.log_every=1",
        "train.global_warmup_steps=0",
        f"train.batch_size={args.batch}",
        "model.seps.variant=code",
        f"data.num_train={args.num_train}",
        "data.num_dev=100",
        "data.num_test=100",
        "train.eval_every=0",
        "eval.split=dev",
    ]
    if args.quick:
        common += ["model.embed_dim=32", "model.tiny_vit.depth=1", "model.tiny_vit.width=32"]
    threads = os.cpu_count() or 2
    runs = {
        "one": ([PYTHON, "-m", "patchword", "train"], [f"train.num_threads={threads}"], threads),
        "two": (
            [
                PYTHON,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node=2",
                "-m",
                "patchword",
                "train",
            ],
            [f"train.num_threads={max(1, threads // 2)}"],
            max(1, threads // 2),
        ),
    }
    result: dict = {"steps": args.steps, "batch": args.batch, "out": str(out), "runs": {}}
    for name, (cmd, extra, omp) in runs.items():
        env = {**os.environ, "OMP_NUM_THREADS": str(omp)}
        start = time.perf_counter()
        subprocess.run([*cmd, *common, f"name={name}", *extra], check=True, env=env, cwd=ROOT)
        losses, times = _train_losses(out / name)
        # steps/s between the first and the last step (the first one warms up)
        rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
        result["runs"][name] = {"steps_per_s": rate, "wall_s": time.perf_counter() - start, "losses": losses}
    one, two = result["runs"]["one"]["losses"], result["runs"]["two"]["losses"]
    rel = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(one, two, strict=True)]
    wa = torch.load(out / "one" / "last.pt", weights_only=True)["model"]
    wb = torch.load(out / "two" / "last.pt", weights_only=True)["model"]
    diffs = torch.cat([(wa[k].double() - wb[k].double()).abs().flatten() for k in wa])
    summary = json.loads((out / "two" / "summary.json").read_text())
    checked = grads(argparse.Namespace(run=str(out / "one"), weights=None, step=None, processes=2))
    result["equivalence"] = {
        "max_rel_loss_diff": max(rel),
        "max_weight_diff": float(diffs.max()),
        "weights_beyond_1e-4": int((diffs > 1e-4).sum()),
        "weights": diffs.numel(),
        "world_size_recorded": summary["world_size"],
        "final_weights_loss_rel_diff": checked["loss_rel_diff"],
        "final_weights_grad_rel_l2_diff": checked["grad_rel_l2_diff"],
    }
    r = result["runs"]
    print(f"1 process ({threads} threads): {r['one']['steps_per_s']:.3f} steps/s")
    print(f"2 processes ({max(1, threads // 2)} thread each): {r['two']['steps_per_s']:.3f} steps/s")
    speedup = r["two"]["steps_per_s"] / r["one"]["steps_per_s"]
    print(f"speed-up {speedup:.2f}x; equivalence {result['equivalence']}")
    return result


# -------------------------------------------------------------------------------------------- grads


def _grads_worker(run: str, weights: str, step: int, out: str) -> None:
    """Loss and gradients of the global batch of ``step`` from ``weights``, in each process of the launch;
    rank 0 saves them (summed over the processes, as the optimiser sees them)."""
    import torch

    from patchword.data.prepare import prepare_data
    from patchword.distributed import session
    from patchword.model import build_model, model_reads_dense
    from patchword.runs import load_run_tokenizer, read_run_config
    from patchword.train.trainer import Trainer

    cfg = read_run_config(run)
    with session(torch.device("cpu"), cfg.dist_timeout_s) as dist:
        use_dense = cfg.data.dense and model_reads_dense(cfg.model)
        tokenizer = load_run_tokenizer(run, cfg.data)
        data = prepare_data(cfg.data, tokenizer, roles=["train", "dev"], use_dense=use_dense)
        model = build_model(cfg.model, vocab_size=data.vocab_size, vocab_words=data.vocab_words)
        split = data.splits["train"]
        trainer = Trainer(
            cfg, model, split, data.splits["dev"], Path(out).parent, tokenizer=tokenizer, dist=dist
        )
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True)["model"])
        n_batches = len(trainer._epoch_batches(0))
        trainer.epoch, trainer.batch_in_epoch = divmod(step, n_batches)
        trainer.step = step
        tc = cfg.train
        scale = 1.0
        if trainer.epoch < tc.align_warmup_epochs:
            scale = min(1.0, step / (tc.align_warmup_epochs * n_batches))
        batch = next(iter(trainer._loader(trainer._epoch_batches(trainer.epoch))))
        model.train()
        loss, stats = trainer.step_fn(
            batch, trainer.epoch >= tc.hardest_after_epochs, step < tc.global_warmup_steps, scale
        )
        loss.backward()
        dist.all_reduce(stats)
        if dist.is_main:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            torch.save({"grads": grads, "loss": float(stats[0])}, out)


def grads(args: argparse.Namespace) -> dict:
    """Compare one global batch's loss and gradients in 1 and in 2 processes."""
    import torch

    run = Path(args.run)
    weights = Path(args.weights or run / "last.pt")
    step = args.step if args.step is not None else torch.load(weights, weights_only=True)["step"]
    out = Path(tempfile.mkdtemp(prefix="ddp_grads_"))
    base = [__file__, "grads-worker", str(run), str(weights), str(step)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([PYTHON, *base, str(out / "one.pt")], check=True, env=env, cwd=ROOT)
    torchrun = [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.processes}"]
    subprocess.run([*torchrun, *base, str(out / "two.pt")], check=True, env=env, cwd=ROOT)
    one, two = torch.load(out / "one.pt"), torch.load(out / "two.pt")
    g1 = torch.cat([g.flatten() for g in one["grads"].values()])
    g2 = torch.cat([two["grads"][n].flatten() for n in one["grads"]])
    per_tensor = {
        n: float((g - two["grads"][n]).norm() / max(float(g.norm()), 1e-30)) for n, g in one["grads"].items()
    }
    # tensors whose gradient is rounding noise (structurally zero: softmax-invariant biases, key biases)
    live = {n: d for n, d in per_tensor.items() if float(one["grads"][n].norm()) > 1e-6 * float(g1.norm())}
    result = {
        "step": step,
        "processes": args.processes,
        "loss_one": one["loss"],
        "loss_two": two["loss"],
        "loss_rel_diff": abs(one["loss"] - two["loss"]) / max(abs(one["loss"]), 1e-12),
        "grad_rel_l2_diff": float((g1 - g2).norm() / g1.norm()),
        "worst_tensor_rel_l2_diff": max(live.values()),
        "noise_tensors": sorted(set(per_tensor) - set(live)),
    }
    print(json.dumps(result, indent=2))
    return result


# ------------------------------------------------------------------------------------------- memory


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _memory_child(batch: int, chunk: int, variant: str, quick: bool) -> dict:
    """Peak memory of one SEPS training step (matcher forward + backward) in this fresh process."""
    import torch

    from patchword.bench.inputs import stand_in_lengths
    from patchword.eval.engine import TensorMemoryMeter
    from patchword.losses import HingeLoss, RatioLoss
    from patchword.matching import build_matcher
    from patchword.train.step import matcher_rows

    torch.manual_seed(0)
    patches, dim = (16, 64) if quick else (196, 512)
    matcher = build_matcher("seps", embed_dim=dim, num_patches=patches, has_cls=True, variant=variant).train()
    cap_lens, dense_lens = stand_in_lengths()
    lens = cap_lens[:batch]
    dlens = dense_lens[:batch].repeat((batch + dense_lens.numel() - 1) // dense_lens.numel())[:batch]
    g = torch.Generator().manual_seed(0)
    img = torch.randn(batch, patches + 1, dim, generator=g, requires_grad=True)
    caps = torch.randn(batch, int(lens.max()), dim, generator=g, requires_grad=True)
    dense = torch.randn(batch, int(dlens.max()), dim, generator=g, requires_grad=True)
    ratio = RatioLoss(matcher.selection_ratio, mode=matcher.ratio_mode)

    def step(n: int) -> None:
        out = matcher_rows(matcher, img[:n], caps[:n], lens[:n], dense[:n], dlens[:n], chunk)
        (HingeLoss()(out.sims) + ratio(out.decisions)).backward()

    step(2)  # warm-up: kernels, allocator and thread pools are not the step's memory
    base = _rss_mb()
    with TensorMemoryMeter() as meter:
        step(batch)
    return {
        "batch": batch,
        "pair_chunk": chunk,
        "peak_tensor_mb": meter.peak_bytes / 2**20,
        "rss_growth_mb": _rss_mb() - base,
    }


def memory(args: argparse.Namespace) -> dict:
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for batch in batches:
        for chunk in (0, args.chunk):
            cmd = [PYTHON, __file__, "memory-child", str(batch), str(chunk), args.variant]
            cmd += ["--quick"] if args.quick else []
            proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(
                f"batch {row['batch']:4d}  pair_chunk {row['pair_chunk']:3d}: "
                f"peak tensors {row['peak_tensor_mb']:9.1f} MB   "
                f"peak RSS growth {row['rss_growth_mb']:9.1f} MB",
                flush=True,
            )
    return {"variant": args.variant, "rows": rows}


# ----------------------------------------------------------------------------------------- gpu-step


def _model_name(args: argparse.Namespace) -> str:
    return "seps-tiny-paper" if args.quick else args.model


def step_setup(args: argparse.Namespace):
    """The gpu-step setting on ``args.device``: ``(model, cfg, step_module, optimizer, shard, bf16)`` for
    ``args.model`` (``seps-tiny-paper`` with ``--quick``) at ``args.batch``, random initialisation, stand-in
    text lengths, fused AdamW; ``args.unfused`` undoes the fused query/key/value projections and
    ``args.compile`` compiles the encoders and the matcher (``--compile-scope modules``, the trainer's
    ``train.compile``) or the whole loss module in one graph (``step``), in ``torch.compile`` mode
    ``args.compile_mode`` (None: the default). Under ``--precision bf16`` the step module
    runs on ``bf16``, the model's bfloat16 copy (the trainer's :class:`BF16Copy`), else ``bf16`` is None.
    Also used by device_counts.py step-work."""
    import torch

    from patchword.bench.inputs import stand_in_lengths
    from patchword.config import apply_overrides
    from patchword.data.batches import ShardBatch
    from patchword.distributed import Distributed
    from patchword.encoders.fused import unfuse_qkv
    from patchword.factory import create_model
    from patchword.runs.config import RunConfig
    from patchword.train.master_weights import BF16Copy
    from patchword.train.step import ShardLoss

    device = torch.device(args.device)
    model = create_model(
        _model_name(args), pretrained=False, vocab_size=1000 if args.quick else None, device=device
    )
    if args.unfused:  # query/key/value as three products, as transformers writes them
        unfuse_qkv(model)
    cfg = apply_overrides(RunConfig(), [f"train.pair_chunk={args.pair_chunk}", f"precision={args.precision}"])
    bf16 = BF16Copy(model) if args.precision == "bf16" else None
    step_model = model if bf16 is None else bf16.module
    if getattr(args, "text_mask", "default") != "default":
        use_text_mask(step_model.text_encoder, args.text_mask)
    eager_attention = getattr(args, "eager_attention", "none") != "none"
    if eager_attention:
        attention_outside_compile(step_model, args.eager_attention)
    if eager_attention or getattr(args, "static_shapes", False):
        # Between graph breaks, BERT's layers are frames of their own, called at 35 keys (captions) and
        # then at 128 (dense captions): torch.compile would recompile them with the length symbolic (7 of
        # 25 graphs with --eager-attention all, counted on the CPU), and a symbolic length may change the
        # attention kernel chosen. Static graphs, one per length, compare like with like.
        torch._dynamo.config.automatic_dynamic_shapes = False
    scope, mode = getattr(args, "compile_scope", "modules"), getattr(args, "compile_mode", None)
    if args.compile and scope == "modules":
        for module in (step_model.image_encoder, step_model.text_encoder, step_model.matcher):
            module.compile(mode=mode)
    step_module = ShardLoss(step_model, cfg, Distributed(device=device))
    if args.compile and scope == "step":  # encoders, matcher and loss in one graph
        step_module.compile(mode=mode)
    params = model.parameter_groups(cfg.train.lr, cfg.train.backbone_lr_mult)
    optimizer = torch.optim.AdamW(params, weight_decay=cfg.train.weight_decay, fused=True)
    batch, side = args.batch, model.image_encoder.image_size or 224
    cap_lens, dense_lens = stand_in_lengths()
    g = torch.Generator().manual_seed(0)
    lens = cap_lens[:batch].clamp(max=40)
    dlens = dense_lens[:batch]
    low, vocab = (5, 1000) if args.quick else (1000, 30522)  # BERT: past the special and unused ids
    shard = ShardBatch(
        images=torch.randn(batch, 3, side, side, generator=g),
        ids=torch.randint(low, vocab, (batch, int(lens.max())), generator=g),
        lens=lens,
        lens_all=lens,
        img_ids=torch.arange(batch),
        dense_ids=torch.randint(low, vocab, (batch, int(dlens.max())), generator=g),
        dense_lens=dlens,
        dense_lens_all=dlens,
    ).to(device)
    step_model.train()
    return model, cfg, step_module, optimizer, shard, bf16


def caption_width(shard, width: int):
    """``shard`` with its caption ids cut or padded (id 0) to ``width`` positions, its lengths cut to
    it: a batch of another caption width, for steps that take turns over several (``--caption-widths``)."""
    from patchword.data.batches import pad_width

    lens = shard.lens.clamp(max=width)
    ids = pad_width(shard.ids[:, :width], width)
    return dataclasses.replace(shard, ids=ids, lens=lens, lens_all=lens)


def use_text_mask(encoder, form: str) -> None:
    """An experiment, not the library's behaviour: ``encoder`` (a Hugging Face text encoder) hands BERT its
    key padding mask in ``form``: ``additive`` (0 / the dtype's minimum, (B, 1, L, L)), ``broadcast``
    (boolean (B, 1, 1, L)) or ``contiguous`` (boolean (B, 1, L, L), materialised) instead of the
    library's boolean (B, 1, L, L) view; which form keeps a fused attention kernel when compiled is what
    ``benchmarks/attention_probe.py`` asks. Same values: only the mask's layout changes."""
    import types

    import torch
    from attention_probe import key_mask

    from patchword.encoders.hf import HFTextEncoder

    if not isinstance(encoder, HFTextEncoder):
        raise SystemExit(f"--text-mask needs a Hugging Face text encoder, not {type(encoder).__name__}")

    def forward(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        keep = (ids != 0) & (positions < lens.to(ids.device)[:, None])  # (B, L), as the library's
        mask = key_mask(form, keep, self.proj.weight.dtype)
        return self.proj(self.backbone(input_ids=ids, attention_mask=mask).last_hidden_state)

    encoder.forward = types.MethodType(forward, encoder)


def attention_outside_compile(model, which: str) -> int:
    """An experiment, not the library's behaviour: the Hugging Face attention layers of ``model``'s text
    encoder (``which="text"``), its image encoder (``"image"``) or both (``"all"``) run
    ``F.scaled_dot_product_attention`` outside any compiled graph (``torch.compiler.disable``: a graph
    break around each call). Eager dispatch then picks the backend from the real tensors, as it does
    without compile (cuDNN attention for every layer on the H100 of run 3), whatever the traced view of
    them would pick (the float32 math attention for 12 of the 36 layers there: one pass of one encoder,
    which the probe names). The cost is a graph break per layer and pass. Same values.
    Returns how many attention layers were marked."""
    import functools

    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from patchword.encoders.fused import QKV_NAMES

    encoders = {"text": [model.text_encoder], "image": [model.image_encoder]}.get(
        which, [model.text_encoder, model.image_encoder]
    )
    marked = 0
    for encoder in encoders:
        backbone = getattr(encoder, "backbone", None)
        if not isinstance(backbone, torch.nn.Module):
            raise SystemExit(f"--eager-attention needs Hugging Face encoders, not {type(encoder).__name__}")
        for module in backbone.modules():  # the self-attention layers, which call the attention function
            if any(all(isinstance(getattr(module, n, None), torch.nn.Module) for n in t) for t in QKV_NAMES):
                module._attention_outside_compile = True
                marked += 1
    if not marked:
        raise SystemExit(f"--eager-attention {which}: no attention layer found (transformers changed?)")
    outside = torch.compiler.disable(sdpa_attention_forward)

    @functools.wraps(sdpa_attention_forward)
    def attention(module, *args, **kwargs):
        if getattr(module, "_attention_outside_compile", False):
            return outside(module, *args, **kwargs)
        return sdpa_attention_forward(module, *args, **kwargs)

    ALL_ATTENTION_FUNCTIONS["sdpa"] = attention  # this process's models: the benchmark's only
    return marked


def optimizer_step(model, cfg, optimizer, bf16, found_inf=None) -> None:
    """What the trainer does after the backward pass: the bfloat16 copy's gradients to the master weights
    (``bf16``, from :func:`step_setup`), clipping, the fused AdamW step (skipped on the device where
    ``found_inf`` is 1), the copy refreshed."""
    import torch

    if bf16 is not None:
        bf16.push_grads()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip, foreach=True)
    if found_inf is not None:
        optimizer.found_inf = found_inf
    optimizer.step()
    if found_inf is not None:
        del optimizer.found_inf
    if bf16 is not None:
        bf16.pull()


class CompiledOptimizerSide:
    """An experiment, not the library's behaviour: the optimizer side of a ``precision=bf16`` step as one
    ``torch.compile``'d function, so that Inductor fuses what :func:`optimizer_step` runs as separate
    passes over every weight: the bfloat16 gradients read where the backward pass left them (no float32
    copy), the global norm, the clipping, AdamW on the float32 master weights and the refreshed bfloat16
    copy (docs/benchmarks.md, run 3: the optimizer side reads and writes ~10 GB per step; one fused pass
    needs about 6). PyTorch's multi-tensor AdamW (``foreach``, ``capturable``: no host value read) on the
    state the fused optimizer made in a first eager step (a parameter without state then is left out for
    good: the benchmark's step trains the same parameters every time). Unlike the trainer's step it does
    not skip a step whose loss is not finite.

    Usage: ``side = CompiledOptimizerSide(model, cfg, optimizer, bf16)`` after one :func:`optimizer_step`,
    then ``side()`` after each backward pass instead of it; returns the gradient norm before clipping.
    """

    def __init__(self, model, cfg, optimizer, bf16) -> None:
        import torch

        pairs = bf16._pairs if bf16 is not None else []  # (float32 master, its bfloat16 copy)
        copy_of = {id(master): own for master, own in pairs}
        self.groups, self.hypers = [], []
        for group in optimizer.param_groups:
            params = [p for p in group["params"] if p in optimizer.state]
            hyper = {
                "lr": group["lr"],
                "beta1": group["betas"][0],
                "beta2": group["betas"][1],
                "weight_decay": group["weight_decay"],
                "eps": group["eps"],
                "amsgrad": group["amsgrad"],
                "maximize": group["maximize"],
            }
            # (master, the tensor whose .grad the backward pass fills: its bf16 copy or itself)
            self.groups.append([(p, copy_of.get(id(p), p)) for p in params])
            self.hypers.append(hyper)
        self.optimizer, self.max_norm = optimizer, cfg.train.grad_clip
        self._copies, self._copied_from = [own for _, own in pairs], [master for master, _ in pairs]
        self._compiled = torch.compile(self._side)

    def _side(self, grads, masters, exp_avgs, exp_avg_sqs, steps, copies, copied_from):
        import torch
        from torch.optim.adamw import adamw

        flat = [g for group in grads for g in group]
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(flat, 2, dtype=torch.float32)))
        coef = (self.max_norm / (total + 1e-6)).clamp(max=1.0) if self.max_norm else total.new_ones(())
        for hyper, g, p, m, v, t in zip(
            self.hypers, grads, masters, exp_avgs, exp_avg_sqs, steps, strict=True
        ):
            wide = [x.float() * coef for x in g]
            adamw(p, wide, m, v, [], t, foreach=True, capturable=True, **hyper)
        if copies:
            torch._foreach_copy_(copies, copied_from)
        return total

    def __call__(self):
        import torch

        grads, masters, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []  # one list per group each
        for pairs in self.groups:
            used = [(p, src) for p, src in pairs if src.grad is not None]
            state = [self.optimizer.state[p] for p, _ in used]
            grads.append([src.grad for _, src in used])
            masters.append([p for p, _ in used])
            exp_avgs.append([s["exp_avg"] for s in state])
            exp_avg_sqs.append([s["exp_avg_sq"] for s in state])
            steps.append([s["step"] for s in state])
        with torch.no_grad():
            total = self._compiled(
                grads, masters, exp_avgs, exp_avg_sqs, steps, self._copies, self._copied_from
            )
        for pairs in self.groups:  # the gradients are spent: the next backward pass starts afresh
            for p, src in pairs:
                src.grad = p.grad = None
        return total


def compiled_optimizer_check(args: argparse.Namespace) -> dict:
    """:class:`CompiledOptimizerSide` against :func:`optimizer_step` (the trainer's optimizer side) from the
    same weights, optimizer state and gradients (a second step of ``args.model`` at ``args.batch`` in
    ``precision=bf16``, on ``args.device``): the largest weight difference (absolute, and in units of the
    learning rate), the largest moment difference, and how many bfloat16 copies are bit-identical."""
    import copy

    import torch

    setting = argparse.Namespace(**{**vars(args), "precision": "bf16", "pair_chunk": 0, "compile": False})
    model, cfg, step_module, optimizer, shard, bf16 = step_setup(setting)

    def backward() -> None:
        optimizer.zero_grad(set_to_none=True)
        step_module(shard, True, False, 1.0)[0].backward()

    backward()
    optimizer_step(model, cfg, optimizer, bf16)  # the optimizer's state
    backward()
    weights = [p.detach().clone() for p in model.parameters()]
    state = copy.deepcopy(optimizer.state_dict())
    grads = [(own, own.grad.clone()) for _, own in bf16._pairs if own.grad is not None]
    own_grads = [(p, p.grad.clone()) for p in model.parameters() if p.grad is not None]  # not copied
    optimizer_step(model, cfg, optimizer, bf16)
    eager = [p.detach().clone() for p in model.parameters()]
    eager_copies = [own.detach().clone() for _, own in bf16._pairs]
    eager_state = copy.deepcopy(optimizer.state_dict())["state"]
    with torch.no_grad():  # back to before the eager step
        for p, w in zip(model.parameters(), weights, strict=True):
            p.copy_(w)
    optimizer.load_state_dict(state)
    for tensor, grad in grads + own_grads:
        tensor.grad = grad
    bf16.pull()
    start = time.perf_counter()
    CompiledOptimizerSide(model, cfg, optimizer, bf16)()
    compile_s = time.perf_counter() - start
    diff = max(float((p.detach() - e).abs().max()) for p, e in zip(model.parameters(), eager, strict=True))
    after = optimizer.state_dict()["state"]
    moments = max(
        float((after[k][name] - eager_state[k][name]).abs().max())
        for k in after
        for name in ("exp_avg", "exp_avg_sq")
    )
    same = sum(bool(torch.equal(own, e)) for (_, own), e in zip(bf16._pairs, eager_copies, strict=True))
    lr = optimizer.param_groups[0]["lr"]
    result = {
        "model": _model_name(args),
        "batch": args.batch,
        "device": args.device,
        "weights": sum(p.numel() for p in model.parameters()),
        "max_weight_diff": diff,
        "max_weight_diff_in_lr": diff / lr,
        "max_moment_diff": moments,
        "bf16_copies_identical": same,
        "bf16_copies": len(eager_copies),
        "compile_and_step_s": round(compile_s, 1),
    }
    print(json.dumps(result, indent=2))
    return result


#: why torch.compile kept graphs off CUDA graphs in this process (``skipping cudagraphs due to ...``)
CUDAGRAPH_SKIPS: list[str] = []


class _SkipReasons(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("skipping cudagraphs"):
            CUDAGRAPH_SKIPS.append(" ".join(message.split())[:300])


def record_cudagraph_skips() -> None:
    """Collect, in :data:`CUDAGRAPH_SKIPS`, the reasons PyTorch logs for each graph it does not capture."""
    logging.getLogger("torch._inductor.cudagraph_utils").addHandler(_SkipReasons())


def compile_counts() -> dict:
    """What torch.compile did in this process so far: graphs compiled, graph breaks, and graphs kept off
    CUDA graphs with the first reasons given: a CUDA-graph variant that skipped its graphs measures the
    uncaptured step."""
    from torch._dynamo.utils import counters

    return {
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"]),
        "cudagraph_skip_reasons": CUDAGRAPH_SKIPS[:5],
    }


def gpu_step(args: argparse.Namespace) -> dict:
    import torch

    from patchword.precision import autocast_context
    from patchword.runs.config import CUDA_GRAPH_COMPILE_MODES

    device = torch.device(args.device)
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if getattr(args, "no_math_sdp", False):
        # attention may not fall back to the math backend: the trace picks a fused kernel or fails, and
        # PyTorch's warnings then say why each fused kernel was refused
        torch.backends.cuda.enable_math_sdp(False)
    if getattr(args, "math_sdp_bf16", False):
        # the "math" attention in bfloat16 instead of upcast to float32 (PyTorch's default since 2.5)
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
    record_cudagraph_skips()
    model, cfg, step_module, optimizer, shard, bf16 = step_setup(args)
    name, batch = _model_name(args), args.batch
    widths = [int(w) for w in getattr(args, "caption_widths", "").split(",") if w]
    # --caption-widths: the steps take turns over batches of these caption widths, as a dataset's do
    shards = [caption_width(shard, w) for w in widths] or [shard]
    turns = itertools.count()

    cuda_graphs = args.compile and getattr(args, "compile_mode", None) in CUDA_GRAPH_COMPILE_MODES
    compile_optimizer = bool(getattr(args, "compile_optimizer", False))
    wait_go = bool(getattr(args, "wait_go", False))  # timed only when told (gpu_compile_variants)
    compiled_side: list[CompiledOptimizerSide] = []  # --compile-optimizer: made after the first step

    def step() -> None:  # the trainer's step (Trainer._train_step) without its logging
        if cuda_graphs:  # the previous step's graph outputs are dead: their memory may be reused
            torch.compiler.cudagraph_mark_step_begin()
        optimizer.zero_grad(set_to_none=True)
        with autocast_context(cfg.precision, device):
            loss, stats = step_module(shards[next(turns) % len(shards)], True, False, 1.0)
        loss.backward()
        if compiled_side:
            compiled_side[0]()
            return
        optimizer_step(model, cfg, optimizer, bf16, found_inf=(~torch.isfinite(stats[0])).float())
        if compile_optimizer:  # the optimizer's state exists now
            compiled_side.append(CompiledOptimizerSide(model, cfg, optimizer, bf16))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    # --compile-optimizer: the first step makes the optimizer's state, the second compiles the side; a
    # compilation inside the timed steps would be timed as a step
    warmup = max(args.warmup, 2) if compile_optimizer else args.warmup
    if len(shards) > 1:  # each width: traced (the second one with the width symbolic), then recorded
        warmup = max(warmup, 4 * len(shards))  # a round more than that takes
    for _ in range(warmup):
        step()
    sync()
    held: dict = {}  # device memory the compilation and warm-up reserved, and what stays reserved
    if device.type == "cuda":
        held["warmup_peak_reserved_gb"] = torch.cuda.max_memory_reserved(device) / 2**30
        if wait_go:  # while others compile beside it: hold only what it uses
            torch.cuda.empty_cache()
        held["reserved_after_warmup_gb"] = torch.cuda.memory_reserved(device) / 2**30
        torch.cuda.reset_peak_memory_stats()
        if args.sync_debug:  # report every op of the step that makes the host wait for the GPU
            torch.cuda.set_sync_debug_mode("warn")
    if wait_go:  # compiled and warm: wait for the turn to time
        print("gpu-step: ready", flush=True)
        if not sys.stdin.readline():
            raise SystemExit("gpu-step: stdin closed before the turn to time came")
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    seconds = time.perf_counter() - start
    result = {
        "model": name,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "batch": batch,
        "precision": args.precision,
        "pair_chunk": args.pair_chunk,
        "compile": args.compile,
        "compile_scope": getattr(args, "compile_scope", "modules") if args.compile else None,
        "compile_mode": getattr(args, "compile_mode", None) if args.compile else None,
        "fused_qkv": not args.unfused,
        "math_sdp_bf16": bool(getattr(args, "math_sdp_bf16", False)),
        "no_math_sdp": bool(getattr(args, "no_math_sdp", False)),
        "text_mask": getattr(args, "text_mask", "default"),
        "eager_attention": getattr(args, "eager_attention", "none"),
        "compile_optimizer": compile_optimizer,
        "caption_widths": widths or [shard.ids.shape[1]],
        "automatic_dynamic_shapes": bool(torch._dynamo.config.automatic_dynamic_shapes),
        "warmup_steps": warmup,
        "steps_per_s": args.steps / seconds,
        "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        **held,
    }
    if args.compile or compile_optimizer:
        result["compile_counts"] = compile_counts()
    print(json.dumps(result, indent=2), flush=True)  # the timing first: the profiler may not finish
    if getattr(args, "json", None):
        Path(args.json).write_text(json.dumps(result, indent=2))  # rewritten with the profile below
    if getattr(args, "profile_steps", 0):
        try:
            result["profile"] = _profile_steps(step, sync, args.profile_steps, device)
        except Exception as err:  # noqa: BLE001 - the timing above stands without its profile
            result["profile_error"] = f"{type(err).__name__}: {err}"[:500]
    return result


#: kernel name patterns -> the kind of device work they are (first match wins; see kernel_kind)
KERNEL_KINDS = (
    ("attention, softmax", ("sdpa", "flash", "fmha", "attention", "softmax")),
    ("gemm fp32", ("gemm_f32f32", "sgemm")),
    ("gemm", ("gemm", "nvjet", "xmma", "cublas", "cutlass", "sm90_", "sm80_")),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("triton", ("triton_",)),  # before copy: Inductor's kernels fuse casts (`_to_copy`) into their names
    ("copy", ("memcpy", "memset", "copy")),
    ("norm", ("layer_norm", "layernorm", "gammabeta", "rowwisemoments")),
    ("reduction", ("reduce_kernel",)),
    ("elementwise", ("elementwise", "vectorized")),
)


def kernel_kind(name: str) -> str:
    """The kind of a CUDA kernel from its name (:data:`KERNEL_KINDS`), ``other`` when none matches."""
    low = name.lower()
    for kind, patterns in KERNEL_KINDS:
        if any(pattern in low for pattern in patterns):
            return kind
    return "other"


def _profile_steps(step, sync, n: int, device) -> dict:
    """``torch.profiler`` over ``n`` steps: host wall ms per step, device busy ms per step (the kernels'
    self time), kernel launches and host syncs per step, and the top ops by device then host time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(n):
            step()
        sync()
    wall = time.perf_counter() - start
    events = prof.key_averages()
    kernels = [  # GPU user annotations (Optimizer.step#...) span kernels already counted
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]
    by_kind: dict[str, float] = {}  # kernels, copies and sets: ms per step
    for e in kernels:
        kind = kernel_kind(e.name)
        by_kind[kind] = by_kind.get(kind, 0.0) + e.time_range.elapsed_us() / 1e3 / n
    syncs = sum(e.count for e in events if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize"))
    launches = sum(
        e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx")
    )
    graph_launches = sum(e.count for e in events if e.key in ("cudaGraphLaunch", "cuGraphLaunch"))
    ops = sum(e.count for e in events if e.key.startswith("aten::"))
    tables = {}
    for key in ("self_device_time_total", "self_cpu_time_total") if kernels else ("self_cpu_time_total",):
        with contextlib.suppress(AttributeError, KeyError, ValueError):
            tables[key] = events.table(sort_by=key, row_limit=20)
    return {
        "steps": n,
        "wall_ms_per_step": 1e3 * wall / n,  # profiled: slower than the timed steps
        "device_busy_ms_per_step": sum(by_kind.values()),
        "kernel_launches_per_step": launches / n,  # outside CUDA graphs
        "graph_launches_per_step": graph_launches / n,
        "aten_calls_per_step": ops / n,
        "host_syncs_per_step": syncs / n,
        "device_ms_per_step_by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "tables": tables,
    }


# -------------------------------------------------------------------------------------- gpu-scoring


def gpu_scoring(args: argparse.Namespace) -> dict:
    import torch

    from patchword.bench.inputs import (
        SCORING_SHAPES,
        build_bench_matcher,
        scoring_inputs,
        stand_in_lengths,
    )
    from patchword.eval import score_matrix
    from patchword.testing import seps_reference_scores

    device = torch.device(args.device)
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    shapes = dict(SCORING_SHAPES)
    if args.quick:
        shapes = {"tiny": (16, 80)}
    matcher = build_bench_matcher(args.config).to(device)
    dense_on = args.config != "laps"
    caption_tied = matcher.dense_pairing == "caption"
    cap_lens, dense_lens = stand_in_lengths()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    result: dict = {"config": args.config, "device": str(device), "shapes": {}}
    for label, (n_img, n_txt) in shapes.items():
        if label not in args.shapes.split(",") and not args.quick:
            continue
        reps = (n_img + dense_lens.numel() - 1) // dense_lens.numel()
        img, caps, lens, dense, dlens, t2i = scoring_inputs(
            n_img, cap_lens.repeat(reps), dense_lens.repeat(reps)
        )
        caps, lens, t2i = caps[:n_txt], lens[:n_txt], t2i[:n_txt]
        d, dl = (dense, dlens) if dense_on else (None, None)
        kwargs = {
            "txt2img": t2i if caption_tied else None,
            "max_memory_mb": args.max_memory_mb,
            "device": device,
        }
        # warm-up (kernels, allocator): two images and their captions
        warm = {**kwargs, "txt2img": t2i[:10] if caption_tied else None}
        warm_dense = (d[:2], dl[:2]) if dense_on else (None, None)
        score_matrix(matcher, img[:2], caps[:10], lens[:10], *warm_dense, **warm)
        sync()
        start = time.perf_counter()
        sims = score_matrix(matcher, img, caps, lens, d, dl, **kwargs)
        sync()
        engine_s = time.perf_counter() - start
        # the official loop on a slice: all images against a few captions spread over the lengths
        cols = torch.arange(args.ref_captions) * (n_txt // args.ref_captions)
        ref_img = img[: args.ref_images].to(device)
        ref_dense = (
            (d[: args.ref_images].to(device), dl[: args.ref_images].to(device)) if dense_on else (None, None)
        )
        index = t2i[cols].to(device) if caption_tied and dense_on else None
        if caption_tied and dense_on:
            ref_dense = (d.to(device), dl.to(device))
        ref_args = (caps[cols].to(device), lens[cols].to(device), *ref_dense)
        seps_reference_scores(matcher, ref_img[:2], *ref_args, dense_index=index)  # warm-up
        sync()
        start = time.perf_counter()
        ref = seps_reference_scores(matcher, ref_img, *ref_args, dense_index=index)
        sync()
        ref_s = time.perf_counter() - start
        ref_pairs = ref.numel()
        entry = {
            "images": n_img,
            "captions": n_txt,
            "engine_s": engine_s,
            "engine_pairs_per_s": n_img * n_txt / engine_s,
            "reference_pairs_timed": ref_pairs,
            "reference_s_extrapolated": ref_s / ref_pairs * n_img * n_txt,
            "speedup": (ref_s / ref_pairs) / (engine_s / (n_img * n_txt)),
            "max_abs_diff_on_slice": float((sims[: args.ref_images, cols] - ref.float().cpu()).abs().max()),
        }
        result["shapes"][label] = entry
        print(label, json.dumps(entry), flush=True)
    return result


# --------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_cpu = sub.add_parser("cpu", help="1 vs 2 processes on this CPU")
    p_cpu.add_argument("--steps", type=int, default=60)
    p_cpu.add_argument("--batch", type=int, default=64)
    p_cpu.add_argument("--num-train", type=int, default=2000, help="synthetic training images")
    p_cpu.add_argument("--out", default=None, help="where the two runs go (default: a temporary directory)")
    p_grads = sub.add_parser("grads", help="one global batch's loss and gradients, 1 vs N processes")
    p_grads.add_argument("--run", required=True, help="a run directory (its config, vocabulary, data)")
    p_grads.add_argument("--weights", default=None, help="checkpoint (default RUN/last.pt)")
    p_grads.add_argument("--step", type=int, default=None, help="which global batch (default: the next one)")
    p_grads.add_argument("--processes", type=int, default=2)
    p_gw = sub.add_parser("grads-worker", help=argparse.SUPPRESS)
    for name in ("run", "weights", "step", "out"):
        p_gw.add_argument(name)
    p_mem = sub.add_parser("memory", help="peak memory of the SEPS step, unchunked and chunked")
    p_mem.add_argument("--batches", default="32,64,128")
    p_mem.add_argument("--chunk", type=int, default=16, help="captions per block of the chunked step")
    p_mem.add_argument("--variant", default="paper", choices=["code", "paper"])
    p_child = sub.add_parser("memory-child", help=argparse.SUPPRESS)
    p_child.add_argument("batch", type=int)
    p_child.add_argument("chunk", type=int)
    p_child.add_argument("variant")
    p_gpu = sub.add_parser("gpu-step", help="SEPS training steps/s at ViT-B/16 + BERT-base shapes")
    p_gpu.add_argument("--device", default="cuda")
    p_gpu.add_argument("--model", default="seps-vit-b16-paper", help="a patchword.factory model name")
    p_gpu.add_argument("--batch", type=int, default=64)
    p_gpu.add_argument("--precision", default="amp_bf16", choices=["fp32", "amp_bf16", "amp_fp16", "bf16"])
    p_gpu.add_argument("--steps", type=int, default=20)
    p_gpu.add_argument("--warmup", type=int, default=3)
    p_gpu.add_argument("--pair-chunk", type=int, default=0)
    p_gpu.add_argument("--compile", action="store_true")
    p_gpu.add_argument(
        "--compile-scope",
        default="modules",
        choices=["modules", "step"],
        help="compile the encoders and the matcher (train.compile) or the whole loss module",
    )
    p_gpu.add_argument(
        "--compile-mode", default=None, help="torch.compile mode, e.g. reduce-overhead (CUDA graphs)"
    )
    p_gpu.add_argument("--unfused", action="store_true", help="query/key/value as three products (A/B)")
    p_gpu.add_argument(
        "--text-mask",
        default="default",
        choices=["default", "additive", "broadcast", "contiguous"],
        help="the form of the key padding mask the text encoder hands BERT (an experiment: use_text_mask)",
    )
    p_gpu.add_argument(
        "--eager-attention",
        default="none",
        choices=["none", "text", "image", "all"],
        help="run the text encoder's (image encoder's, every encoder's) attention outside the compiled graph "
        "(an experiment: attention_outside_compile)",
    )
    p_gpu.add_argument(
        "--compile-optimizer",
        action="store_true",
        help="the optimizer side of the step (clipping, AdamW, the bf16 copy) as one compiled function after "
        "the first step (an experiment: CompiledOptimizerSide)",
    )
    p_gpu.add_argument(
        "--math-sdp-bf16",
        action="store_true",
        help="attention on the math backend in bfloat16, not float32 (allow_fp16_bf16_reduction_math_sdp)",
    )
    p_gpu.add_argument(
        "--no-math-sdp",
        action="store_true",
        help="disable the math attention backend (torch.backends.cuda.enable_math_sdp(False)): a fused "
        "kernel or an error naming why none fits",
    )
    p_gpu.add_argument(
        "--static-shapes",
        action="store_true",
        help="no automatic dynamic shapes: a frame called at another size is recompiled for it, never "
        "traced with the size symbolic (torch._dynamo.config.automatic_dynamic_shapes=False)",
    )
    p_gpu.add_argument(
        "--caption-widths",
        default="",
        help="comma-separated caption widths the steps take turns over (e.g. 32,40: a dataset's batches "
        "padded to multiples of 16, train.text_width_multiple); default: the one stand-in batch (35)",
    )
    p_gpu.add_argument("--tf32", action="store_true", help="TF32 matmuls for the fp32 parts")
    p_gpu.add_argument("--sync-debug", action="store_true", help="warn on every host-device sync of the step")
    p_gpu.add_argument("--profile-steps", type=int, default=0, help="then profile this many steps")
    p_gpu.add_argument(
        "--wait-go",
        action="store_true",
        help="after the warm-up steps print 'gpu-step: ready' and time only once a line arrives on stdin "
        "(several variants compile at once, then take turns on the device: gpu_check_extra)",
    )
    p_co = sub.add_parser(
        "compiled-optimizer-check", help="the compiled optimizer side against the eager one, one step"
    )
    p_co.add_argument("--device", default="cpu")
    p_co.add_argument("--model", default="seps-vit-b16-paper", help="a patchword.factory model name")
    p_co.add_argument("--batch", type=int, default=4)
    p_co.add_argument("--unfused", action="store_true", help=argparse.SUPPRESS)
    p_sc = sub.add_parser("gpu-scoring", help="exhaustive scoring vs the official loop")
    p_sc.add_argument("--device", default="cuda")
    p_sc.add_argument("--config", default="seps-code-image", help="a patchword.bench SCORING_CONFIGS name")
    p_sc.add_argument("--shapes", default="f30k,coco5k")
    p_sc.add_argument("--ref-images", type=int, default=1000, help="images of the official loop's slice")
    p_sc.add_argument("--ref-captions", type=int, default=20, help="captions of the official loop's slice")
    p_sc.add_argument("--max-memory-mb", type=float, default=16384)
    p_sc.add_argument("--tf32", action="store_true")
    for p in (p_cpu, p_grads, p_gw, p_mem, p_child, p_gpu, p_co, p_sc):
        p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
        p.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if args.command == "grads-worker":
        _grads_worker(args.run, args.weights, int(args.step), args.out)
        return 0
    if args.command == "memory-child":
        print(json.dumps(_memory_child(args.batch, args.chunk, args.variant, args.quick)))
        return 0
    if args.quick:
        if args.command == "cpu":
            args.steps, args.batch, args.num_train = 4, 8, 20
        elif args.command == "memory":
            args.batches, args.chunk = "8,16", 4
        elif args.command == "gpu-step":
            args.steps, args.warmup, args.batch = 2, 1, 8
        elif args.command == "gpu-scoring":
            args.ref_images, args.ref_captions = 16, 4
    commands = {
        "cpu": cpu,
        "grads": grads,
        "memory": memory,
        "gpu-step": gpu_step,
        "gpu-scoring": gpu_scoring,
        "compiled-optimizer-check": compiled_optimizer_check,
    }
    run = commands[args.command]
    result = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
