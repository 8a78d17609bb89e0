"""The cost of reading a shortlist's rows from a shard file: numpy's memory map alone
(``np.load(mmap_mode="r")``, as before the size check) against :class:`patchword.search.shards.ShardArray`
(the same map, plus one ``os.stat`` per shard and gather that turns a file cut short in place into an error
instead of SIGBUS).

    python benchmarks/shard_reads.py [--rows 4000] [--shortlist 100] [--trials 7] [--file PATH]

Writes a (rows, 197, 512) float16 file once (ViT-B/16 tokens; ~0.8 GB for 4000 rows; default
/tmp/shard_reads.npy), then times reading ``--shortlist`` random rows with the kernel's read-ahead advice
first, warm (pages cached) and cold (the file's pages dropped with ``posix_fadvise(DONTNEED)``), alternating
the two readers. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import mmap
import os
import time
from pathlib import Path

import numpy as np

from patchword.bench.machine import machine_description
from patchword.search.shards import ShardArray


def _write(file: Path, rows: int) -> None:
    array = np.lib.format.open_memmap(file, mode="w+", dtype=np.float16, shape=(rows, 197, 512))
    for start in range(0, rows, 500):
        block = np.random.default_rng(start).standard_normal((min(500, rows - start), 197, 512))
        array[start : start + len(block)] = block.astype(np.float16)
    array.flush()
    del array


def _drop(file: Path) -> None:
    fd = os.open(file, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--shortlist", type=int, default=100)
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--file", type=Path, default=Path("/tmp/shard_reads.npy"))
    args = parser.parse_args()
    if not args.file.is_file():
        _write(args.file, args.rows)
    mapped = np.load(args.file, mmap_mode="r")
    shard = ShardArray(args.file)

    def numpy_map(rows: np.ndarray) -> np.ndarray:
        page = mmap.PAGESIZE
        for row in rows.tolist():  # the same read-ahead advice the index gives
            start = int(mapped.offset) + row * mapped.strides[0]
            aligned = start - start % page
            mapped._mmap.madvise(mmap.MADV_WILLNEED, aligned, start - aligned + mapped.strides[0])
        return np.asarray(mapped[rows])

    def shard_array(rows: np.ndarray) -> np.ndarray:
        shard.advise(rows)
        return shard.read_rows(rows)

    rng = np.random.default_rng(0)
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.trials):
        for name, read in (("np.load map", numpy_map), ("ShardArray (map + size check)", shard_array)):
            for cache in ("warm", "cold"):
                rows = rng.choice(len(mapped), args.shortlist, replace=False)
                _drop(args.file) if cache == "cold" else read(rows)
                start = time.perf_counter()
                out = read(rows)
                times.setdefault((name, cache), []).append((time.perf_counter() - start) * 1e3)
                assert np.array_equal(out, np.asarray(mapped[rows]))
    print(machine_description())
    shape = f"{mapped.shape} {mapped.dtype}"
    print(f"{args.shortlist} random rows of {shape}, median (min) of {args.trials} trials:")
    for (name, cache), values in times.items():
        print(f"  {name:32s} {cache}: {np.median(values):6.2f} ms ({min(values):.2f})")


if __name__ == "__main__":
    main()
