"""One training step over a global batch, split between processes: the loss module DDP wraps and the
DDP plumbing around it.

Every process encodes its shard of the global batch, gathers what the loss needs from the others (with
gradient) and computes its share of the global batch's loss, so that the shares, and the gradients summed
over processes, are exactly those of a one-process run of the same batch.
"""

from __future__ import annotations

import logging
import os

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from patchword.data.batches import ShardBatch
from patchword.distributed import Distributed
from patchword.losses import CMCLoss, ContrastiveLoss, HingeLoss, RatioLoss
from patchword.matching.base import Matcher, MatcherOutput
from patchword.matching.ops import full_precision
from patchword.model import RetrievalModel
from patchword.runs.config import RunConfig

__all__ = [
    "ShardLoss",
    "matcher_rows",
    "wrap_ddp",
    "sum_gradients",
    "sync_batch_norm",
    "average_batch_norm_statistics",
    "usable_cpus",
    "fused_supported",
]

_logger = logging.getLogger(__name__)


def matcher_rows(
    matcher: Matcher,
    img: torch.Tensor,
    caps: torch.Tensor,
    lens: torch.Tensor,
    dense: torch.Tensor | None,
    dense_lens: torch.Tensor | None,
    chunk: int = 0,
) -> MatcherOutput:
    """``matcher(img, caps, lens, dense, dense_lens)``, optionally in blocks of ``chunk`` captions whose
    activations are recomputed in the backward pass (``torch.utils.checkpoint``): the fine-grained
    step's memory then grows with B_v x chunk instead of B_v x B_t. Sims and decisions equal the
    unchunked call's (a decision that depends on the image only is repeated once per block, which leaves
    its mean unchanged)."""
    n = caps.shape[0]
    if chunk <= 0 or chunk >= n:
        return matcher(img, caps, lens, dense, dense_lens)
    per_caption = dense is not None and matcher.dense_pairing == "caption"
    outs = []
    for t0 in range(0, n, chunk):
        part = slice(t0, t0 + chunk)
        d, dl = (dense[part], dense_lens[part]) if per_caption else (dense, dense_lens)
        outs.append(checkpoint(matcher, img, caps[part], lens[part], d, dl, use_reentrant=False))
    decisions = [torch.cat(branch, dim=1) for branch in zip(*(o.decisions for o in outs), strict=True)]
    return MatcherOutput(sims=torch.cat([o.sims for o in outs], dim=1), decisions=decisions)


class ShardLoss(nn.Module):
    """This process's share of the loss of one global batch: the module ``DistributedDataParallel`` wraps.

    The process encodes its b images and b captions, gathers every process's caption tokens (with
    gradient) and scores its images against all B captions: a (b, B) row block of the global score
    matrix, i.e. 1/W of the fine-grained work (the official code has every process score the full
    B x B). The rows are gathered (with gradient) into the (B, B) matrix, on which the process takes its
    share of the hinge: its rows' image queries and its columns' caption queries
    (``HingeLoss(..., queries=)``); TGDT's CMC loss likewise over the gathered global
    embeddings, the ratio loss on decision means reduced over the global batch (each process adds 1/W of
    it). The shares sum to the one-process loss, and since every gather's backward sums the processes'
    gradients, the gradients summed over processes (the DDP comm hook sums, it does not average) are the
    one-process gradients.
    """

    def __init__(self, model: RetrievalModel, cfg: RunConfig, dist: Distributed) -> None:
        super().__init__()
        self.model, self.dist = model, dist
        tc, matcher = cfg.train, model.matcher
        self.hinge = HingeLoss(margin=tc.margin)
        self.contrastive = ContrastiveLoss() if tc.loss == "infonce" else None
        self.ratio = RatioLoss(matcher.selection_ratio or 1.0, mode=matcher.ratio_mode)
        self.cmc = CMCLoss(margin=tc.margin) if matcher.global_loss == "cmc" else None
        self.ratio_weight, self.pair_chunk = tc.ratio_weight, tc.pair_chunk
        note = constant_ratio_loss(matcher, tc.ratio_weight)
        if note and dist.is_main:
            _logger.info(note)

    def forward(
        self, batch: ShardBatch, hardest: bool, global_only: bool, align_scale: float | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (this process's loss share, detached [loss, align, ratio] shares); summed over processes
        they are the global batch's loss and its terms, each as weighted in the loss (``align`` times the
        warm-up's ``align_scale``, ``ratio`` times ``train.ratio_weight``): loss = align + ratio."""
        dist, model = self.dist, self.model
        matcher = model.matcher
        n = batch.lens_all.shape[0]
        sizes, (lo, hi) = dist.shard_sizes(n), dist.shard(n)
        gather = _gather_rows(dist, sizes)
        img = model.encode_images(batch.images)
        cap = model.encode_texts(batch.ids, batch.lens)
        decisions, extras = [], {}
        if global_only:  # global warm-up: cosine of the global embeddings
            g_img, g_txt = matcher.global_embed(img, cap, batch.lens)
            rows = g_img @ gather(g_txt).T
        else:
            dense = dense_lens = None
            if batch.dense_ids is not None and matcher.consumes_dense:
                dense, dense_lens = model.encode_texts(batch.dense_ids, batch.dense_lens), batch.dense_lens
                if matcher.dense_pairing == "caption":  # every caption's dense text
                    dense, dense_lens = gather(dense), batch.dense_lens_all
            caps = gather(cap)
            out = matcher_rows(matcher, img, caps, batch.lens_all, dense, dense_lens, self.pair_chunk)
            rows, decisions, extras = out.sims, out.decisions, out.extras
        sims = gather(full_precision(rows))  # (B, B)
        queries = slice(lo, hi)
        if self.contrastive is not None:  # CLIP's InfoNCE, the matcher's learned temperature
            scale = matcher.temperature_scale()
            align = self.contrastive(sims, scale, batch.img_ids, batch.ignore, queries=queries)
        else:
            align = self.hinge(sims, batch.img_ids, batch.ignore, hardest, queries=queries)
        if self.cmc is not None and "global_img" in extras:
            # The CMC ranking term follows the same sum -> hardest-negative schedule as the hinge.
            g_img = gather(full_precision(extras["global_img"]))
            g_txt = full_precision(extras["global_txt"])
            align = align + self.cmc(g_img, g_txt, batch.img_ids, hardest, queries=queries)
        # NAAF: thresholds from the global batch, repeated images as one (a stand-in row, at lo = B,
        # is no batch row: it adds nothing)
        if "row_max" in extras:
            matcher.update_from_batch(
                sims.detach(),
                extras["row_max"],
                batch.lens_all,
                row_offset=lo,
                image_ids=batch.img_ids,
                all_reduce=dist.all_reduce,
            )
        align = align * align_scale
        ratio = sims.new_zeros(())
        if decisions:
            # Each branch's kept share over the global batch: this shard's part of the mean (a decision
            # has one row per local image; a stand-in's weight hi - lo is 0), summed over the processes
            # with gradient.
            parts = torch.stack([d.float().sum() * ((hi - lo) / (d.numel() * n)) for d in decisions])
            ratio = self.ratio.from_ratios(dist.all_gather(parts[None], (1,) * dist.world_size).sum(0))
        share = ratio / dist.world_size  # every process computes the whole ratio loss
        weighted = self.ratio_weight * share
        loss = align + weighted
        # the logged parts are the loss's terms as weighted in it (align by the warm-up's scale, ratio by
        # train.ratio_weight): they add up to the loss
        return loss, torch.stack([loss, align, weighted]).detach()


def _gather_rows(dist: Distributed, sizes: tuple[int, ...]):
    """``x -> (B, ...)``: every process's rows of a global batch (``sizes`` of them), gathered with gradient.

    A process without rows of a batch (a batch of fewer captions than processes) holds one stand-in
    row instead (:func:`~patchword.train.feed.shard_block`): the encoders and matchers never see an empty
    input, and the step takes part in every collective and in DDP's gradient reduction as the others do.
    Those processes are the last ranks (:func:`~patchword.distributed.shard_bounds`), so their stand-ins
    are the gathered rows past B, dropped here: nothing of them reaches the loss, and their gradient is 0.
    """
    held = tuple(max(1, size) for size in sizes)
    if held == sizes:
        return lambda x: dist.all_gather(x, sizes)
    total = sum(sizes)
    return lambda x: dist.all_gather(x, held)[:total]


def constant_ratio_loss(matcher: Matcher, weight: float) -> str | None:
    """The log line saying that the ratio loss cannot train this matcher, or None where it can (or there is
    none: no patch selection, ``train.ratio_weight=0``).

    Top-K selection keeps exactly K = ceil(rho * N) patches per branch, so every decision's forward mean is
    K/N and the loss is a constant: ``(n_b * K/N - rho)^2`` summing the masks (official code) or
    ``n_b * (K/N - rho)^2`` per branch (paper variant). Its gradient is that constant's coefficient times
    the relaxed decisions' gradient: zero with hard masks (code variant), and zero with straight-through
    (Gumbel) decisions too when K/N = rho, i.e. whenever rho * N is an integer (every shipped preset).
    """
    rho, cfg = matcher.selection_ratio, getattr(matcher, "config", None)
    n, k = getattr(cfg, "num_patches", None), getattr(matcher, "num_keep", None)
    if not rho or not weight or n is None or k is None:
        return None
    branches, share = len(getattr(matcher, "selection_branches", ("caption",))), k / n
    coefficient = branches * share - rho if matcher.ratio_mode == "sum_masks" else share - rho
    value = coefficient**2 if matcher.ratio_mode == "sum_masks" else branches * coefficient**2
    if getattr(cfg, "gumbel", False) and coefficient != 0:
        return None
    why = "its decisions are hard masks" if not getattr(cfg, "gumbel", False) else f"K/N = rho = {rho}"
    return (
        f"train.ratio_weight={weight}: the ratio loss is the constant {value:.4g} with zero gradient (top-K "
        f"selection keeps exactly K={k} of N={n} patches per branch and {why}): it offsets the logged loss "
        "and trains nothing"
    )


def sum_gradients(state, bucket):
    """DDP comm hook: sum the processes' gradients (the loss is a sum over the global batch; DDP's default
    would average them). 16-bit gradients (``precision=bf16``) are summed in float32: one rounding of the
    sum instead of one per process."""
    buffer = bucket.buffer()
    wide = buffer.float() if buffer.dtype in (torch.bfloat16, torch.float16) else buffer
    fut = torch.distributed.all_reduce(wide, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(buffer.dtype))


def wrap_ddp(module: nn.Module, device: torch.device) -> nn.Module:
    """``DistributedDataParallel`` summing the processes' gradients, without buffer broadcasts (NAAF's
    thresholds are reduced explicitly and identical everywhere; BatchNorm's running statistics are
    averaged before they are used: :func:`average_batch_norm_statistics`)."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    no_sync = (
        {"forward_sync_buffers": False}
        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        else {"broadcast_buffers": False}
    )
    # find_unused_parameters=True is deliberate: the global warm-up leaves the matcher out, HF encoders
    # have poolers no loss reads, and which parameters a step uses changes during a run. In a step that
    # uses them all, PyTorch advises (once per process, from C++) to turn it off: that advice does not
    # apply here (docs/distributed.md says so).
    ddp = DistributedDataParallel(
        module,
        device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=True,
        **no_sync,
    )
    ddp.register_comm_hook(None, sum_gradients)
    return ddp


def sync_batch_norm(model: nn.Module, dist: Distributed) -> None:
    """BatchNorm statistics over the global batch (SyncBatchNorm, CUDA only), in place."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    if dist.device.type != "cuda":
        if dist.is_main:
            _logger.warning(
                "%d BatchNorm layer(s) normalise per process on the CPU (SyncBatchNorm needs CUDA): the run "
                "is not exactly a one-process run of the global batch (their running statistics are "
                "averaged over the processes before every validation and checkpoint)",
                len(norms),
            )
        return
    for name, child in list(model.named_children()):
        setattr(model, name, nn.SyncBatchNorm.convert_sync_batchnorm(child, process_group=dist.group))


def average_batch_norm_statistics(model: nn.Module, dist: Distributed) -> None:
    """Every process's BatchNorm running means and variances replaced by their mean over the processes, in
    place (one sum through the gloo group, in float64), so that every process evaluates, and rank 0
    saves, the same statistics, those of the whole run's batches (each process's layers see only its
    shards on the CPU). SyncBatchNorm layers (CUDA) hold the global statistics already; one process:
    nothing. The update of a running statistic is linear, so averaging now or later gives the same
    statistics up to rounding: a resume from an averaged checkpoint continues as the run would have."""
    if not dist.enabled:
        return
    stats = [
        stat
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, nn.SyncBatchNorm)
        for stat in (m.running_mean, m.running_var)
        if stat is not None
    ]
    if not stats:  # the same on every process: the same model
        return
    flat = torch.cat([stat.detach().reshape(-1).to("cpu", torch.float64) for stat in stats])
    torch.distributed.all_reduce(flat, group=dist.cpu_group)
    flat /= dist.world_size
    with torch.no_grad():
        for stat, mean in zip(stats, flat.split([stat.numel() for stat in stats]), strict=True):
            stat.copy_(mean.view_as(stat))


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, e.g. a SLURM allocation), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def fused_supported(device: torch.device) -> bool:
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return device.type in _get_fused_kernels_supported_devices()
