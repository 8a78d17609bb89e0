"""How an index stores token vectors: float32, float16, int8 with a per-token scale, or product-quantised.

A token store encodes a shard's (rows, L, C) float32 tokens into named arrays written next to each other
(``NNNNN.tokens.npy`` and, for the compressed stores, ``NNNNN.tokens.scale.npy`` or the PQ codes), and decodes
only the rows a query re-ranks. Bytes per token of C = 512 (ViT-B/16 in the joint space):

=========  ===========================================  ================
store      arrays per token                              bytes (C = 512)
=========  ===========================================  ================
float32    C float32                                     2048
float16    C float16                                     1024
int8       C int8 + one float16 scale (~max |x| / 127)   514
pq         m uint8 codes of a product quantiser           m (64 by default, ``--pq-bytes``)
=========  ===========================================  ================

The product quantiser (FAISS's ``ProductQuantizer``, ``m`` sub-vectors of C / m dimensions, 256 centroids
each) is trained once per index, on the tokens of the first shard encoded, and stored in the index
(``codec.npz``: the centroids). Decoding is one gather from the centroid table, so FAISS is needed to build
a PQ index, not to search it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from patchword.errors import ConfigError, MissingExtraError

__all__ = ["STORES", "TokenCodec", "check_store", "make_codec", "load_codec", "CODEC_FILE"]

STORES = ("float32", "float16", "int8", "pq")
CODEC_FILE = "codec.npz"
#: Tokens the product quantiser needs to train on: one per centroid at the least (FAISS wants ~40x that
#: for good centroids).
PQ_MIN_TOKENS = 256


@dataclass
class TokenCodec:
    """Encode / decode token vectors of one store (see the module docstring).

    Attributes:
        store: one of :data:`STORES`.
        centroids: pq only: (m, 256, C / m) float32.
    """

    store: str
    centroids: np.ndarray | None = None

    # ------------------------------------------------------------------ layout
    def suffixes(self) -> tuple[str, ...]:
        """The arrays a token tensor is stored as: ``""`` the main one, ``".scale"`` int8's scales."""
        return ("", ".scale") if self.store == "int8" else ("",)

    def bytes_per_token(self, dim: int) -> int:
        return {"float32": 4 * dim, "float16": 2 * dim, "int8": dim + 2}.get(
            self.store, 0 if self.centroids is None else self.centroids.shape[0]
        )

    # ------------------------------------------------------------------ encode / decode
    def encode(self, tokens: np.ndarray) -> dict[str, np.ndarray]:
        """(rows, L, C) float32 -> ``{suffix: array}``."""
        tokens = np.asarray(tokens, dtype=np.float32)
        if self.store == "float32":
            return {"": tokens}
        if self.store == "float16":
            return {"": tokens.astype(np.float16)}
        if self.store == "int8":
            peak = np.abs(tokens).max(axis=-1)
            # the scale as stored (float16), rounded up so that 127 steps reach the token's peak
            scale = (peak / 127.0).astype(np.float16)
            short = scale.astype(np.float32) * 127.0 < peak
            scale[short] = np.nextafter(scale[short], np.float16(np.inf))
            safe = np.where(scale > 0, scale, np.float16(1)).astype(np.float32)
            codes = np.clip(np.rint(tokens / safe[..., None]), -127, 127).astype(np.int8)
            return {"": codes, ".scale": scale}
        return {"": self._pq_encode(tokens)}

    def decode(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """``{suffix: rows of the stored arrays}`` -> (k, L, C) float32."""
        main = arrays[""]
        if self.store in ("float32", "float16"):
            return main.astype(np.float32, copy=False)
        if self.store == "int8":
            return main.astype(np.float32) * arrays[".scale"].astype(np.float32)[..., None]
        import torch

        m, n_centroids, sub = self.centroids.shape
        # one gather from the (m * 256, sub) table, code c of sub-vector j at row j * 256 + c: torch's
        # index_select runs on every thread, m numpy gathers on one (docs/benchmarks.md, "Numbers behind
        # code choices")
        rows = torch.from_numpy(main).to(torch.int32)
        rows += torch.arange(m, dtype=torch.int32) * n_centroids  # (k, L, m)
        table = torch.from_numpy(self.centroids.reshape(m * n_centroids, sub))
        if sub in (1, 2):  # a centroid is one 4- or 8-byte element: an element gather beats a row gather
            table = table.view(torch.int32 if sub == 1 else torch.int64).reshape(-1)
            return (
                table.index_select(0, rows.reshape(-1))
                .view(torch.float32)
                .reshape(*main.shape[:-1], -1)
                .numpy()
            )
        return table.index_select(0, rows.reshape(-1)).reshape(*main.shape[:-1], m * sub).numpy()

    # ------------------------------------------------------------------ product quantisation
    def _pq_encode(self, tokens: np.ndarray) -> np.ndarray:
        m, n_centroids, sub = self.centroids.shape
        flat = tokens.reshape(-1, m, sub)
        codes = np.empty(flat.shape[:2], dtype=np.uint8)
        for j in range(m):  # nearest centroid of each sub-vector, in blocks (bounded memory)
            cent = self.centroids[j]  # (256, sub)
            norms = (cent**2).sum(1)
            for i0 in range(0, len(flat), 65536):
                x = flat[i0 : i0 + 65536, j]
                codes[i0 : i0 + 65536, j] = np.argmin(norms[None] - 2 * x @ cent.T, axis=1)
        return codes.reshape(*tokens.shape[:-1], m)

    def save(self, index_dir: Path) -> None:
        """Write what decoding needs besides the shards (pq: ``codec.npz``)."""
        if self.store == "pq":
            from patchword.fileio import atomic_write

            atomic_write(index_dir / CODEC_FILE, lambda fh: np.savez(fh, centroids=self.centroids))

    def describe(self) -> dict[str, Any]:
        """What the manifest records of the store."""
        out: dict[str, Any] = {"store": self.store}
        if self.centroids is not None:
            m, k, sub = self.centroids.shape
            out.update(pq_m=m, pq_centroids=k, pq_sub_dim=sub)
        return out


def check_store(store: str) -> None:
    """Check, before an index is written, that ``store`` is one of :data:`STORES` and that what building
    it needs is installed (pq: FAISS).

    Raises:
        ConfigError: an unknown store.
        MissingExtraError: pq without FAISS.
    """
    if store not in STORES:
        raise ConfigError("--store", f"must be one of {', '.join(STORES)}, got {store!r}")
    if store == "pq":
        from patchword.eval.two_stage import import_faiss

        try:
            import_faiss()  # quietly: faiss's loader logs every build it tries
        except ImportError:
            raise MissingExtraError(
                "--store pq trains FAISS's product quantiser: pip install 'patchword[ann]'"
            ) from None


def make_codec(
    store: str, sample: np.ndarray | None = None, *, pq_m: int | None = None, seed: int = 0
) -> TokenCodec:
    """A codec for ``store``; pq trains its quantiser on ``sample`` ((n, C) float32 tokens) with ``pq_m``
    sub-vectors (default: one per 8 dimensions, at most 64: 64 bytes per 512-d token).

    Raises:
        ConfigError: an unknown store, or pq with C not divisible by ``pq_m`` / too few samples.
        MissingExtraError: pq without FAISS.
    """
    check_store(store)
    if store != "pq":
        return TokenCodec(store)
    import faiss  # imported (quietly) by check_store

    sample = np.ascontiguousarray(sample, dtype=np.float32)
    dim = sample.shape[1]
    pq_m = pq_m or max(1, min(64, dim // 8))
    if dim % pq_m:
        raise ConfigError("--pq-bytes", f"{pq_m} sub-quantisers do not divide the {dim}-d tokens")
    if len(sample) < PQ_MIN_TOKENS:
        raise ConfigError(
            "--store",
            f"pq needs at least {PQ_MIN_TOKENS} tokens to train on, the first shard has {len(sample)}",
        )
    pq = faiss.ProductQuantizer(dim, pq_m, 8)
    pq.cp.seed = seed
    # FAISS warns once per sub-quantiser below 39 points per centroid; the build report says it once
    # (build_report: the pq sample), and the bound only decides the warning, not the centroids
    pq.cp.min_points_per_centroid = 1
    with _one_openmp_thread(faiss):  # the same centroids whatever the machine's core count
        pq.train(sample)
    centroids = faiss.vector_to_array(pq.centroids).reshape(pq_m, 256, dim // pq_m)
    return TokenCodec("pq", centroids.astype(np.float32))


@contextlib.contextmanager
def _one_openmp_thread(faiss) -> Iterator[None]:
    """FAISS on one OpenMP thread inside the block; its count and torch's given back after it: the two share
    one OpenMP runtime, so FAISS's setting was torch's too (a caller's later work ran on one thread)."""
    import torch

    faiss_threads, torch_threads = faiss.omp_get_max_threads(), torch.get_num_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(faiss_threads)
        torch.set_num_threads(torch_threads)


def load_codec(index_dir: Path, store: str) -> TokenCodec:
    """The codec an index was written with (``store`` from its manifest)."""
    if store != "pq":
        return TokenCodec(store)
    from patchword.errors import DataError

    path = Path(index_dir) / CODEC_FILE
    if not path.is_file():
        raise DataError(f"{index_dir}: a pq index needs {CODEC_FILE}, which is missing; rebuild the index")
    with np.load(path, allow_pickle=False) as data:
        return TokenCodec("pq", data["centroids"].astype(np.float32))
