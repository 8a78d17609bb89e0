"""One process per device, launched by ``torchrun`` (or SLURM's ``srun``): process groups and collectives.

``patchword train`` and ``patchword eval`` open a :func:`session` from the launcher's environment: a plain
``python -m patchword ...`` gets a single-process :class:`Distributed` (every collective is the identity),
``torchrun --nproc_per_node=N -m patchword ...`` initialises ``torch.distributed`` (NCCL on CUDA devices,
gloo on the CPU) and closes it again when the session ends. Nothing here is global beyond
``torch.distributed``'s own state: the :class:`Distributed` value is passed to whatever needs it.

Every collective has a timeout (``dist_timeout_s`` in the run config): a process that dies or stops
answering ends the launch with one :class:`DistributedError` instead of a hang.

Two groups besides the default one (which ``DistributedDataParallel`` uses for its gradient buckets):

* ``group``, on the training device: the gathers *with gradient* of the training step and its small
  reductions. Keeping them off the default group means their order never has to interleave with DDP's
  bucket all-reduces, which the autograd engine launches as gradients become ready.
* ``cpu_group``, always gloo: CPU tensors (evaluation's token and score shards) and Python objects
  (metrics, RNG states, stop flags), which NCCL cannot carry.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from patchword.errors import ConfigError, PatchwordError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "Distributed",
    "DistributedError",
    "LaunchInfo",
    "launch_info",
    "session",
    "shard_bounds",
]

_logger = logging.getLogger(__name__)

#: Seconds a process waits inside one collective before the launch fails (``dist_timeout_s``).
DEFAULT_TIMEOUT_S = 600.0


class DistributedError(PatchwordError, RuntimeError):
    """The launch failed as a whole: another process died, stopped answering, or the launch is malformed."""


@dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits in the launch, read from the launcher's environment."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launcher: str = "none"  # none | torchrun | slurm


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise DistributedError(f"environment variable {key}={env[key]!r} is not an integer") from None


def launch_info(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Rank, world size and local rank from ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``) or, when
    those are absent, from a SLURM step with several tasks (``SLURM_PROCID``/``SLURM_NTASKS``/
    ``SLURM_LOCALID``; ``MASTER_ADDR``/``MASTER_PORT`` must then be exported by the job script).

    A single SLURM task (``sbatch`` running ``python -m patchword`` once) is a single-process launch.

    Raises:
        DistributedError: a malformed environment (non-integer values, a rank outside the world,
            SLURM tasks without ``MASTER_ADDR``/``MASTER_PORT``).
    """
    env = os.environ if env is None else env
    if "WORLD_SIZE" in env and "RANK" in env:
        info = LaunchInfo(
            _int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0
        )
        info = LaunchInfo(info.rank, info.world_size, info.local_rank, "torchrun")
    elif "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        missing = [key for key in ("MASTER_ADDR", "MASTER_PORT") if key not in env]
        if missing:
            raise DistributedError(
                f"a SLURM step with {env['SLURM_NTASKS']} tasks needs {' and '.join(missing)} in the "
                "environment, e.g. export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | "
                "head -n 1) MASTER_PORT=29500 (or launch torchrun once per node instead)"
            )
        info = LaunchInfo(
            _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS"), _int(env, "SLURM_LOCALID"), "slurm"
        )
    else:
        return LaunchInfo()
    if not 0 <= info.rank < info.world_size or info.local_rank < 0:
        raise DistributedError(
            f"rank {info.rank} / local rank {info.local_rank} in a world of {info.world_size}"
        )
    return info


def shard_bounds(n: int, world_size: int) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` blocks of ``range(n)``, one per rank, sizes differing by at most one (the
    first ``n % world_size`` ranks take one more), as ``torch.tensor_split`` cuts."""
    base, extra = divmod(n, world_size)
    return [(r * base + min(r, extra), (r + 1) * base + min(r + 1, extra)) for r in range(world_size)]


class _GatherWithGrad(torch.autograd.Function):
    """All-gather along dim 0 whose backward sums every process's gradient of the gathered tensor and
    hands each process the rows it contributed (BLIP's GatherLayer, extended to unequal shard sizes)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, sizes: tuple[int, ...], rank: int, group: Any) -> torch.Tensor:
        ctx.sizes, ctx.rank, ctx.group = sizes, rank, group
        return _all_gather(x, sizes, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()  # all_reduce works in place; the incoming gradient may be shared
        dist.all_reduce(grad, group=ctx.group)
        lo = sum(ctx.sizes[: ctx.rank])
        return grad[lo : lo + ctx.sizes[ctx.rank]], None, None, None


def _all_gather(x: torch.Tensor, sizes: Sequence[int], group: Any) -> torch.Tensor:
    """Concatenation of every process's ``x`` (process r holds ``sizes[r]`` rows); pads to the largest."""
    if x.shape[0] != sizes[dist.get_rank(group)]:
        raise ValueError(f"this process holds {x.shape[0]} rows but sizes says {sizes[dist.get_rank(group)]}")
    width = max(sizes)
    x = x.contiguous()
    if x.shape[0] < width:
        x = torch.cat([x, x.new_zeros((width - x.shape[0],) + tuple(x.shape[1:]))])
    parts = [torch.empty_like(x) for _ in sizes]
    dist.all_gather(parts, x, group=group)
    return torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])


@dataclass(frozen=True, eq=False)
class Distributed:
    """This process's place in the launch and the collectives the library uses.

    With ``world_size == 1`` every method is the identity (or a no-op), so code paths are the same for
    one and for many processes.

    Attributes:
        rank, world_size, local_rank: as the launcher set them.
        device: this process's device (``cuda:LOCAL_RANK`` on GPUs).
        group: device-side group for the training step's gathers and reductions (None: one process).
        cpu_group: gloo group for CPU tensors and Python objects (None: one process).
        timeout_s: the collectives' timeout.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    group: Any = None
    cpu_group: Any = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs and writes files."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """More than one process."""
        return self.world_size > 1

    def shard(self, n: int) -> tuple[int, int]:
        """This rank's ``[lo, hi)`` block of ``range(n)`` (see :func:`shard_bounds`)."""
        return shard_bounds(n, self.world_size)[self.rank]

    def shard_sizes(self, n: int) -> tuple[int, ...]:
        """Rows of every rank's block of ``range(n)``."""
        return tuple(hi - lo for lo, hi in shard_bounds(n, self.world_size))

    # ------------------------------------------------------------------ device collectives (training step)
    def all_gather(self, x: torch.Tensor, sizes: Sequence[int] | None = None) -> torch.Tensor:
        """Every process's ``x`` concatenated along dim 0, in rank order, differentiable: the backward sums
        all processes' gradients of the result and returns each its own rows.

        Args:
            x: (n_r, ...) this process's rows, on ``device``; the trailing shape must agree everywhere.
            sizes: rows per rank (default: all equal to ``x.shape[0]``).
        """
        if not self.enabled:
            return x
        sizes = tuple(sizes) if sizes is not None else (x.shape[0],) * self.world_size
        if x.requires_grad:
            return _GatherWithGrad.apply(x, sizes, self.rank, self.group)
        return _all_gather(x, sizes, self.group)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of ``x`` over the processes, in place (no gradient); returns ``x``."""
        if self.enabled:
            dist.all_reduce(x, group=self.group)
        return x

    # ------------------------------------------------------------------ CPU collectives (evaluation, control)
    def all_gather_cpu(self, x: torch.Tensor, sizes: Sequence[int] | None = None) -> torch.Tensor:
        """:meth:`all_gather` for CPU tensors through the gloo group (no gradient)."""
        if not self.enabled:
            return x
        sizes = tuple(sizes) if sizes is not None else tuple(self.all_gather_object(int(x.shape[0])))
        return _all_gather(x.detach().cpu(), sizes, self.cpu_group)

    def gather_cpu(self, x: torch.Tensor) -> torch.Tensor | None:
        """Every process's CPU rows concatenated in rank order, on the main process only (None elsewhere):
        what the others need not hold (a full score matrix)."""
        if not self.enabled:
            return x
        sizes = self.all_gather_object(tuple(x.shape))
        x = x.detach().cpu().contiguous()
        width = max(s[0] for s in sizes)
        padded = torch.cat([x, x.new_zeros((width - x.shape[0],) + tuple(x.shape[1:]))])
        parts = [torch.empty_like(padded) for _ in sizes] if self.is_main else None
        dist.gather(padded, parts, dst=0, group=self.cpu_group)
        if not self.is_main:
            return None
        return torch.cat([part[: s[0]] for part, s in zip(parts, sizes, strict=True)])

    def broadcast_object(self, obj: Any) -> Any:
        """The main process's ``obj`` on every process (picklable values)."""
        if not self.enabled:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every process's ``obj``, in rank order."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out

    def any(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag OR-ed over the processes (the decisions every process must take together: stop on a
        signal, stop when the time budget is spent)."""
        if not self.enabled:
            return tuple(bool(f) for f in flags)
        t = torch.tensor([float(bool(f)) for f in flags])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.cpu_group)
        return tuple(bool(v) for v in t.tolist())

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier(group=self.cpu_group)

    @contextlib.contextmanager
    def fail_together(self, what: str) -> Iterator[None]:
        """Run a block that may fail on some processes only (a check of this process's own inputs, its
        memory) before a collective they must all reach; every process then raises, none waits.

        Without it a process that raised would leave the others in the next collective, waiting until
        ``timeout_s`` while it lives on (a caller that catches the error), or failing with "a collective
        failed" and no reason once it exits. After the block the processes compare outcomes (one object
        gather; nothing with one process): a process whose block raised re-raises its own error, the
        others raise a :class:`DistributedError` naming the first failed rank, ``what`` it was doing and
        its message.

        A stop by a signal (:class:`~patchword.errors.Interrupted`, a Ctrl-C, SIGTERM) is not held for
        the comparison, which would wait for every other process's block (a whole evaluation's scoring,
        while pre-emption leaves seconds): the process stops at once, and the others hear of it from the
        launcher (torchrun stops every process when one ends) or from their next collective, which fails
        as the process is gone (:func:`session`).
        """
        if not self.enabled:
            yield
            return
        error: Exception | None = None
        try:
            yield
        except Exception as err:  # re-raised below, once the others have heard of it
            error = err
        said = self.all_gather_object(None if error is None else f"{type(error).__name__}: {error}")
        if error is not None:
            raise error
        failed = [(rank, message) for rank, message in enumerate(said) if message is not None]
        if failed:
            rank, message = failed[0]
            raise DistributedError(f"rank {rank} of {self.world_size} failed in {what}: {message}")


def _backend_failure(err: BaseException) -> bool:
    """Whether ``err`` comes from a collective (a dead peer, a timeout) rather than from our own code."""
    if isinstance(err, DistributedError):  # already says what failed where (Distributed.fail_together)
        return False
    if isinstance(err, dist.DistError):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and any(k in text for k in ("gloo", "nccl", "connection closed"))


def _process_device(device: torch.device, info: LaunchInfo) -> tuple[torch.device, str]:
    """This process's device and backend under a multi-process launch."""
    if device.type == "cuda":
        if device.index is not None:
            raise ConfigError(
                "device",
                f"{device} under a {info.world_size}-process launch: each process uses cuda:LOCAL_RANK; "
                "use device=auto or device=cuda (choose GPUs with CUDA_VISIBLE_DEVICES)",
            )
        count = torch.cuda.device_count()
        if info.local_rank >= count:
            raise DistributedError(
                f"local rank {info.local_rank} but this node has {count} GPU(s): start at most {count} "
                "processes per node (torchrun --nproc_per_node)"
            )
        return torch.device("cuda", info.local_rank), "nccl"
    if device.type == "cpu":
        return device, "gloo"
    raise ConfigError("device", f"{device.type} does not support multi-process launches; use cuda or cpu")


@contextlib.contextmanager
def session(
    device: torch.device | str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S
) -> Iterator[Distributed]:
    """The launch this process belongs to, for the duration of the block.

    Single-process launches get ``Distributed(device=device)`` and touch nothing. Under ``torchrun`` /
    SLURM the default process group is initialised (unless the caller already did, in which case it is
    reused and left open), plus the two groups described in the module docstring; all are destroyed when
    the block ends, also on errors.

    Raises:
        DistributedError: a collective inside the block failed (a process died, or one waited longer than
            ``timeout_s``); the message says which rank saw it.
        ConfigError: a device that cannot be used by several processes (``cuda:1``, ``mps``).
    """
    device = torch.device(device)
    info = launch_info()
    if info.world_size == 1 and not dist.is_initialized():
        yield Distributed(device=device, timeout_s=timeout_s)
        return
    if not dist.is_available():
        raise DistributedError("this PyTorch build has no torch.distributed; launch a single process")
    timeout = datetime.timedelta(seconds=timeout_s)
    owns = not dist.is_initialized()
    if owns:
        device, backend = _process_device(device, info)
        if info.launcher == "slurm":  # env:// reads these
            os.environ.update(
                RANK=str(info.rank), WORLD_SIZE=str(info.world_size), LOCAL_RANK=str(info.local_rank)
            )
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, timeout=timeout)
    else:
        backend = dist.get_backend()
        rank, world = dist.get_rank(), dist.get_world_size()
        info = LaunchInfo(rank, world, info.local_rank, info.launcher)
        if backend == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
    group = dist.new_group(backend=backend, timeout=timeout)
    cpu_group = group if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    ctx = Distributed(info.rank, info.world_size, info.local_rank, device, group, cpu_group, timeout_s)
    _logger.info("rank %d of %d on %s (%s)", ctx.rank, ctx.world_size, device, backend)
    try:
        yield ctx
    except Exception as err:
        if not _backend_failure(err):
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DistributedError(
            f"rank {ctx.rank} of {ctx.world_size}: a collective failed ({first}); another process of the "
            f"launch died (see its log) or did not answer within dist_timeout_s={timeout_s:g} s"
        ) from err
    finally:
        for g in {id(group): group, id(cpu_group): cpu_group}.values():
            with contextlib.suppress(Exception):
                dist.destroy_process_group(g)
        if owns:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
