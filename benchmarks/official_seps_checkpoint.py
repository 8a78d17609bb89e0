"""Write a tiny checkpoint in the official SEPS layout, the Hugging Face directories it needs, and a tiny
dataset in the LAPS/SEPS layout, to try `patchword import` end to end with no download.

    python benchmarks/official_seps_checkpoint.py --out /tmp/official
    patchword import /tmp/official/model_best.pth --out runs/imported --family seps \\
        --hf-vision /tmp/official/hf/vit --hf-text /tmp/official/hf/bert \\
        data.root=/tmp/official/data data.image_root=/tmp/official/data/images \\
        data.dense_train=/tmp/official/data/train.jsonl data.dense_test=/tmp/official/data/test.jsonl
    patchword eval runs/imported
    patchword index build runs/imported --images /tmp/official/data/images --out /tmp/official/index \\
        --dense /tmp/official/data/test.jsonl
    patchword search /tmp/official/index "w3 w7 w12"

The checkpoint is what the official train.py saves as model_best.pth (the VSEModel state dict under its
official keys with transformers-4 backbone names, and an argparse.Namespace of every official argument),
over tiny random ViT / BERT backbones (16-d, one layer, 32-px images): a format check, not a trained model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from patchword.hub import require_transformers
from patchword.testing.official_seps import VOCAB, official_checkpoint, write_tiny_backbones

#: Images per split. dev last: its images are drawn after train's and test's, which stay as they were.
SPLITS = {"train": 16, "test": 12, "dev": 8}
#: The splits with a dense-caption file: the SEPS release has none for dev (a SEPS run validates on
#: training images held out with data.dev_from_train, or on a file `patchword densify` writes).
DENSE_SPLITS = ("train", "test")


def write_dataset(root: Path, seed: int = 0) -> None:
    """{split}_ids.txt / _caps.txt, id_mapping.json, images/, {split}.jsonl dense captions (LAPS layout):
    each split its own images (evaluation refuses a test split sharing images with dev), dense captions
    for train and test only."""
    rng = np.random.default_rng(seed)
    words = VOCAB[5:]
    (root / "images").mkdir(parents=True, exist_ok=True)
    mapping = {}
    for split, n in SPLITS.items():
        ids, caps, dense = [], [], []
        for i in range(n):
            image_id = f"{split}{i}"
            mapping[image_id] = f"{image_id}.png"
            pixels = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "images" / f"{image_id}.png")
            for _ in range(5):
                ids.append(image_id)
                caps.append(" ".join(rng.choice(words, size=5)))
            text = " ".join(rng.choice(words, size=20))
            dense.append(
                json.dumps({"text": text, "model_id": "random", "metadata": {"file": f"{image_id}.png"}})
            )
        (root / f"{split}_ids.txt").write_text("\n".join(ids) + "\n")
        (root / f"{split}_caps.txt").write_text("\n".join(caps) + "\n")
        if split in DENSE_SPLITS:
            (root / f"{split}.jsonl").write_text("\n".join(dense) + "\n")
    (root / "id_mapping.json").write_text(json.dumps(mapping))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    require_transformers()  # a clear message where the extra is missing
    out = args.out
    write_tiny_backbones(out / "hf")
    torch.save(official_checkpoint("vit", embed=32, max_word=32), out / "model_best.pth")
    write_dataset(out / "data")
    print(f"written: {out}/model_best.pth, {out}/hf/{{vit,bert}}, {out}/data")


if __name__ == "__main__":
    main()
