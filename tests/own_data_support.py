"""Tiny copies of the files docs/own_data.md describes, for running its commands as printed: a Flickr30K
in the LAPS / SEPS layout (with its images, dense captions and a Karpathy json of the same images), SCAN
region features, and local Hugging Face ViT / BERT directories, all under one folder (the documentation's
``/data`` and ``/weights`` below it).

The training split has 1030 images: the SEPS recipe holds 1014 of them out as its dev split
(``data.dev_from_train``). ``python tests/own_data_support.py OUT`` writes them to OUT.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

WORDS = "a the man woman dog red shirt runs on in park with ball grass".split()  # noqa: SIM905
SIZES = {"train": 1030, "dev": 8, "test": 10}  # LAPS / Karpathy; the region features: REGION_SIZES
REGION_SIZES = {"train": 30, "dev": 8, "test": 10}  # 150 training captions: one batch of 128
PER_IMAGE = 5


def _captions(rng: np.random.Generator, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(5, 10)))) for _ in range(n)]


def _lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


def write_images_and_text(data: Path, rng: np.random.Generator) -> None:
    """``data/flickr30k-images/*.jpg``, ``data/f30k`` (LAPS / SEPS layout, dense captions of train and test)
    and ``data/dataset_flickr30k.json`` (Karpathy) listing the same images and captions."""
    from PIL import Image

    images, laps = data / "flickr30k-images", data / "f30k"
    images.mkdir(parents=True, exist_ok=True)
    mapping, karpathy, index = {}, [], 0
    for split, n in SIZES.items():
        ids, caps, dense = [], [], []
        for _ in range(n):
            image_id, name = str(index), f"{1000000 + index}.jpg"
            pixels = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(images / name, quality=90)
            mapping[image_id] = name
            sentences = _captions(rng, PER_IMAGE)
            caps += sentences
            # train: one id per image; dev / test: the id once per caption (the LAPS release's layout)
            ids += [image_id] if split == "train" else [image_id] * PER_IMAGE
            text = " ".join(rng.choice(WORDS, size=40))
            dense.append(json.dumps({"text": text, "model_id": "tiny", "metadata": {"image_id": image_id}}))
            karpathy.append(
                {
                    "imgid": index,
                    "filename": name,
                    "split": "val" if split == "dev" else split,
                    "sentences": [{"raw": s, "tokens": s.split()} for s in sentences],
                }
            )
            index += 1
        _lines(laps / f"{split}_ids.txt", ids)
        _lines(laps / f"{split}_caps.txt", caps)
        if split != "dev":  # as the SEPS release: no dense captions for dev
            _lines(laps / f"f30k_{split}.jsonl", dense)
    (laps / "id_mapping.json").write_text(json.dumps(mapping))
    (data / "dataset_flickr30k.json").write_text(json.dumps({"images": karpathy, "dataset": "flickr30k"}))


def write_regions(data: Path, rng: np.random.Generator) -> None:
    """``data/f30k_precomp``: SCAN's layout, 36 regions of 2048 dims per image, 5 captions each, and a
    SCAN-style vocabulary json of the words (``data/vocab/f30k_precomp_vocab.json``)."""
    from patchword.data.tokenizers import WordVocab

    root = data / "f30k_precomp"
    root.mkdir(parents=True, exist_ok=True)
    for split, n in REGION_SIZES.items():
        np.save(root / f"{split}_ims.npy", rng.random((n, 36, 2048), dtype=np.float32))
        _lines(root / f"{split}_caps.txt", _captions(rng, n * PER_IMAGE))
        _lines(
            root / f"{split}_ids.txt",
            [str(5000 * (split != "train") + 100 * (split == "test") + i) for i in range(n)],
        )
    (data / "vocab").mkdir(exist_ok=True)
    WordVocab(WORDS).save(data / "vocab" / "f30k_precomp_vocab.json")


def write_weights(weights: Path) -> None:
    """``weights/vit-base-patch16-224-in21k`` (224 pixels in 16-pixel patches, as the real one) and
    ``weights/bert-base-uncased`` (512 positions, a vocabulary of the captions' words), both one layer of
    16 dimensions, as ``save_pretrained`` writes them; ``weights/glove.840B.300d.txt``, 300-d vectors of
    the words."""
    import transformers

    vit = weights / "vit-base-patch16-224-in21k"
    config = transformers.ViTConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        image_size=224,
        patch_size=16,
    )
    transformers.ViTModel(config, add_pooling_layer=False).save_pretrained(vit)
    bert = weights / "bert-base-uncased"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=512,
    )
    transformers.BertModel(config).save_pretrained(bert)
    _lines(bert / "vocab.txt", vocab)
    (bert / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    vectors = np.random.default_rng(1).random((len(WORDS), 300))
    _lines(
        weights / "glove.840B.300d.txt",
        [" ".join([w, *map(str, v.round(4))]) for w, v in zip(WORDS, vectors, strict=True)],
    )


def write_own_data(out: Path) -> None:
    """Everything above under ``out/data`` and ``out/weights``."""
    rng = np.random.default_rng(0)
    write_images_and_text(out / "data", rng)
    write_regions(out / "data", rng)
    write_weights(out / "weights")


if __name__ == "__main__":
    write_own_data(Path(sys.argv[1]))
