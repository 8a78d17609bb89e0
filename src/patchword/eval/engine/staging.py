"""Where a scoring job's tensors live while an engine works on it.

On an accelerator (any device that is not the CPU: cuda, xpu, mps, the simulated device of
:mod:`patchword.testing.simulated_device`) every host<->device copy and every value read back on the host
(``.item()``, ``.tolist()``, ``int(t.max())``, a boolean mask) makes the host wait for the device, and a
block loop that waits once per block runs at the speed of the launches, not of the arithmetic. So a job is
*staged* once before its loop:

* the token tensors go to the compute device once, in the engine's dtype (on the CPU they stay as given:
  the CPU engines convert block by block, which costs nothing there and keeps a float16 store compact);
* the lengths and pairings the loop plans with (``cap_lens``, ``dense_lens``, ``dense_index``) are read on
  the host once: widths, length buckets and distinct dense rows are Python numbers from then on;
* the same lengths and pairings are on the device too, for the gathers inside the loop, and index
  tensors the loop slices (orders, columns) are uploaded once with :meth:`Staged.put`.

A tensor that indexes another lives on the other's device: the loop indexes device tensors with the
device copies and host tensors with the host ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from patchword.eval.engine.base import ScoringInputs

__all__ = ["Staged", "host", "is_accelerator", "row_buffer", "stage"]


def is_accelerator(device: torch.device | str) -> bool:
    """Whether ``device`` is anything but the CPU (where the GPU-first block plan applies)."""
    return torch.device(device).type != "cpu"


def host(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """``tensor`` on the CPU (one copy when it is elsewhere), None stays None."""
    return tensor if tensor is None or tensor.device.type == "cpu" else tensor.cpu()


@dataclass
class Staged:
    """A scoring job ready for a block loop on ``device``.

    Attributes:
        inputs: the job; its token tensors (``img_tokens``, ``cap_tokens``, ``dense_tokens``,
            ``image_constants``, ``patch_prior``) on ``device`` (accelerators: in ``dtype``), its lengths
            and pairing (``cap_lens``, ``dense_lens``, ``dense_index``) on the host, for planning.
        device: where the engine computes.
        dtype: the engine's compute dtype (None: the inputs' own).
        cap_lens: (N_txt,) int64 on ``device``.
        dense_lens: (N_dense,) int64 on ``device``, or None.
        dense_index: (N_txt,) int64 on ``device``, or None (dense text tied to images, or none).
    """

    inputs: ScoringInputs
    device: torch.device
    dtype: torch.dtype | None
    cap_lens: torch.Tensor
    dense_lens: torch.Tensor | None
    dense_index: torch.Tensor | None

    @property
    def accelerator(self) -> bool:
        return is_accelerator(self.device)

    def put(self, index: torch.Tensor) -> torch.Tensor:
        """A host tensor on the device, uploaded once before the loop that slices it (no copy on the CPU).

        ``non_blocking``: a copy from pageable host memory is staged at once and does not wait for the
        device's queue."""
        return index if not self.accelerator else index.to(self.device, non_blocking=True)

    def tokens(self, tensor: torch.Tensor) -> torch.Tensor:
        """A block of token rows (already indexed) as the engine computes with it: on ``device``, in
        ``dtype`` (a no-op for staged tensors on an accelerator and for float32 CPU inputs)."""
        return tensor.to(device=self.device, dtype=self.dtype or tensor.dtype)


def stage(inputs: ScoringInputs, device: torch.device | str, dtype: torch.dtype | None) -> Staged:
    """Stage ``inputs`` for an engine computing on ``device`` in ``dtype`` (see the module docstring)."""
    device = torch.device(device)
    meta = replace(
        inputs,
        cap_lens=host(inputs.cap_lens),
        dense_lens=host(inputs.dense_lens),
        dense_index=host(inputs.dense_index),
    )
    if not is_accelerator(device):
        moved = replace(
            meta,
            img_tokens=host(inputs.img_tokens),
            cap_tokens=host(inputs.cap_tokens),
            dense_tokens=host(inputs.dense_tokens),
            image_constants=host(inputs.image_constants),
            patch_prior=host(inputs.patch_prior),
        )
        return Staged(moved, device, dtype, moved.cap_lens, moved.dense_lens, moved.dense_index)

    def to_device(tensor: torch.Tensor | None, cast: bool) -> torch.Tensor | None:
        if tensor is None:
            return None
        cast = cast and dtype is not None and tensor.is_floating_point()
        return tensor.to(device=device, dtype=dtype if cast else tensor.dtype, non_blocking=True)

    moved = replace(
        meta,
        img_tokens=to_device(inputs.img_tokens, True),
        cap_tokens=to_device(inputs.cap_tokens, True),
        dense_tokens=to_device(inputs.dense_tokens, True),
        image_constants=to_device(inputs.image_constants, True),
        patch_prior=to_device(inputs.patch_prior, True),
    )
    return Staged(
        moved,
        device,
        dtype,
        to_device(meta.cap_lens, False),
        to_device(meta.dense_lens, False),
        to_device(meta.dense_index, False),
    )


def row_buffer(job: Staged, out: torch.Tensor, i0: int, i1: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Where the (B, N_txt) rows ``i0 .. i1`` of a whole-matrix job are assembled, and where they go then.

    On the CPU (or when ``out`` is on the compute device) the rows of ``out`` themselves, and None; on an
    accelerator with a host ``out``, a device buffer and the rows of ``out`` it is copied into once, when
    the image block is done: one copy back per image block instead of one per block."""
    if not job.accelerator or out.device.type == job.device.type:
        return out[i0:i1], None
    return torch.empty(i1 - i0, out.shape[1], dtype=out.dtype, device=job.device), out[i0:i1]
