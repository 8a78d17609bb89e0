"""Write ``src/patchword/eval/known_splits/*.npy``: the caption hashes of the published test splits.

Each file holds the sorted distinct 64-bit hashes (:func:`patchword.eval.known_splits.caption_hashes`) of a
test split's captions, read from the public files in ``shared/data`` (their origins, commits and sha256 in
each folder's SOURCES.md); the library identifies a measured split by them (no caption text is shipped).

    .venv/bin/python benchmarks/make_known_splits.py [--shared ../shared]

Sources: Flickr30K 1K test = ``f30k_1k_test/test_caps.txt`` (SCAN's, 5000 lines); MS-COCO 5K test =
``coco_5k_test/testall_caps.txt`` (SCAN's, 25000); Flickr8K 1K test = ``flickr8k_text/f8k_test_captions.tsv``
(the official 1000 test images' 5000 captions).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from patchword.eval.known_splits import KNOWN_SPLITS, caption_hashes

ROOT = Path(__file__).resolve().parents[1]


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _tsv_column(path: Path, column: str) -> list[str]:
    with open(path, encoding="utf-8", newline="") as fh:
        return [row[column] for row in csv.DictReader(fh, delimiter="\t")]


SOURCES = {
    "f30k_1k_test": lambda data: _lines(data / "f30k_1k_test" / "test_caps.txt"),
    "coco_5k_test": lambda data: _lines(data / "coco_5k_test" / "testall_caps.txt"),
    "f8k_1k_test": lambda data: _tsv_column(data / "flickr8k_text" / "f8k_test_captions.tsv", "caption"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared", help="the shared folder")
    args = parser.parse_args(argv)
    out = ROOT / "src" / "patchword" / "eval" / "known_splits"
    out.mkdir(exist_ok=True)
    for name, read in SOURCES.items():
        captions = read(args.shared / "data")
        if len(captions) != KNOWN_SPLITS[name].captions:
            raise SystemExit(f"{name}: {len(captions)} captions, expected {KNOWN_SPLITS[name].captions}")
        hashes = np.unique(caption_hashes(captions))  # sorted, distinct
        np.save(out / f"{name}.npy", hashes)
        print(f"{name}: {len(captions)} captions, {hashes.size} distinct keys -> {out / name}.npy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
