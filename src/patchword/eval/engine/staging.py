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

__all__ = [
    "PairBlocks",
    "Staged",
    "host",
    "host_pairs",
    "is_accelerator",
    "pair_blocks",
    "row_buffer",
    "stage",
    "sub_job",
]


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


# -- listed pairs (ScoringEngine.score_pairs) -------------------------------------------------------------

#: How many matrix cells a block of :func:`pair_blocks` may compute per pair it holds: on the CPU every cell
#: costs its arithmetic (no pair is scored that is not listed, as when images were scored one at a time);
#: on an accelerator a small block is bound by its kernel launches, not by its cells, so a block may score
#: up to 4 cells per pair, or any number up to ``_LAUNCH_BOUND_CELLS``.
_CELLS_PER_PAIR = {False: 1, True: 4}
_LAUNCH_BOUND_CELLS = 4096


@dataclass
class PairBlocks:
    """How :meth:`~patchword.eval.engine.base.ScoringEngine.score_pairs` splits a list of pairs: blocks of
    images, each scored against the distinct texts its pairs name; host tensors the blocks slice.

    Attributes:
        images: (B_all,) int64 the pairs' distinct images, block after block.
        texts: (T_all,) int64 each block's distinct texts, block after block.
        cells: (P,) int64 each pair's cell in its block's row-major (images x texts) matrix.
        pairs: (P,) int64 each pair's position in the caller's lists, in the order of ``cells``.
        blocks: per block, its ``(start, stop)`` in ``images``, in ``texts`` and in ``cells`` / ``pairs``.
    """

    images: torch.Tensor
    texts: torch.Tensor
    cells: torch.Tensor
    pairs: torch.Tensor
    blocks: list[tuple[tuple[int, int], tuple[int, int], tuple[int, int]]]


def pair_blocks(
    inputs: ScoringInputs, img_index: torch.Tensor, txt_index: torch.Tensor, budget: int, accelerator: bool
) -> PairBlocks:
    """Group (P,) host pairs by image into blocks of consecutive distinct images (ascending). A block grows
    while its (images x texts) matrix has at most ``_CELLS_PER_PAIR[accelerator]`` cells per pair it holds
    (on an accelerator, or at most ``_LAUNCH_BOUND_CELLS`` cells) and its gathered tokens and matrix take at
    most a quarter of ``budget`` bytes (the engine's working memory has the budget); it holds one image at
    least."""
    order = torch.argsort(img_index, stable=True)
    images, counts = torch.unique_consecutive(img_index[order], return_counts=True)
    named = txt_index[order].split(counts.tolist())
    image_tied = inputs.dense_tokens is not None and inputs.dense_index is None
    per_image = _row_bytes(inputs.img_tokens) + (_row_bytes(inputs.dense_tokens) if image_tied else 0)
    per_text = _row_bytes(inputs.cap_tokens)
    ratio = _CELLS_PER_PAIR[accelerator]
    groups: list[list[torch.Tensor]] = []  # each block's images' texts
    distinct: set[int] = set()
    held = 0  # pairs of the open block
    for texts in named:
        listed = texts.tolist()
        grown = distinct.union(listed)
        n_img, n_txt = len(groups[-1]) + 1 if groups else 1, len(grown)
        cells = n_img * n_txt
        fits = 4 * (n_img * per_image + n_txt * per_text + 4 * cells) <= budget
        cheap = cells <= ratio * (held + len(listed)) or (accelerator and cells <= _LAUNCH_BOUND_CELLS)
        if groups and fits and cheap:
            groups[-1].append(texts)
            distinct, held = grown, held + len(listed)
        else:
            groups.append([texts])
            distinct, held = set(listed), len(listed)
    block_texts, block_cells, blocks = [], [], []
    i0 = t0 = p0 = 0
    for group in groups:
        members = torch.cat(group)
        columns, column = torch.unique(members, return_inverse=True)  # sorted distinct texts
        rows = torch.arange(len(group)).repeat_interleave(torch.tensor([t.numel() for t in group]))
        block_texts.append(columns)
        block_cells.append(rows * columns.numel() + column)
        i1, t1, p1 = i0 + len(group), t0 + columns.numel(), p0 + members.numel()
        blocks.append(((i0, i1), (t0, t1), (p0, p1)))
        i0, t0, p0 = i1, t1, p1
    empty = torch.zeros(0, dtype=torch.long)
    return PairBlocks(
        images,
        torch.cat(block_texts) if block_texts else empty,
        torch.cat(block_cells) if block_cells else empty,
        order,
        blocks,
    )


def _row_bytes(tokens: torch.Tensor) -> int:
    """Bytes of one row (one image's or one text's tokens) of an (N, L, C) tensor."""
    return tokens.shape[1] * tokens.shape[2] * tokens.element_size()


def host_pairs(img_index, txt_index, n_img: int, n_txt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(P,) int64 image and text indices on the host (one copy back when they are on a device), each
    checked to be in its range (out of range, a device gather faults instead of raising)."""
    img_index, txt_index = torch.as_tensor(img_index), torch.as_tensor(txt_index)
    if img_index.dim() != 1 or img_index.shape != txt_index.shape:
        raise ValueError(
            "img_index and txt_index must be (P,) index lists of one length, got shapes "
            f"{tuple(img_index.shape)} and {tuple(txt_index.shape)}"
        )
    both = host(torch.stack([img_index.long(), txt_index.long().to(img_index.device)]))
    for values, size, name in ((both[0], n_img, "img_index"), (both[1], n_txt, "txt_index")):
        if values.numel() and (int(values.min()) < 0 or int(values.max()) >= size):
            raise ValueError(f"{name} holds indices outside [0, {size})")
    return both[0], both[1]


def sub_job(job: Staged, images: tuple[torch.Tensor, torch.Tensor], texts: tuple[torch.Tensor, torch.Tensor]):
    """``job`` restricted to some images and texts, each given as (host index, device index): tokens and
    device lengths are gathered on the device, host lengths on the host (no copy either way); dense rows
    follow their images (image-tied) or their texts (``dense_index``)."""
    inputs = job.inputs
    (rows, rows_d), (cols, cols_d) = images, texts
    dense, dense_lens, dense_index = inputs.dense_tokens, inputs.dense_lens, inputs.dense_index
    dense_lens_d, dense_index_d = job.dense_lens, job.dense_index
    if dense is not None and dense_index is None:  # image-tied: row v belongs to image v
        dense, dense_lens, dense_lens_d = dense[rows_d], dense_lens[rows], dense_lens_d[rows_d]
    elif dense is not None:
        dense_index, dense_index_d = dense_index[cols], dense_index_d[cols_d]
    sub = ScoringInputs(
        inputs.img_tokens[rows_d],
        inputs.cap_tokens[cols_d],
        inputs.cap_lens[cols],
        dense,
        dense_lens,
        dense_index,
        None if inputs.image_constants is None else inputs.image_constants[rows_d],
        None if inputs.patch_prior is None else inputs.patch_prior[rows_d],
    )
    return Staged(sub, job.device, job.dtype, job.cap_lens[cols_d], dense_lens_d, dense_index_d)
