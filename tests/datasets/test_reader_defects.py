"""Reader defects that paired captions with the wrong image, or failed far from the file at fault.

Each test is named after what a reader did silently (or where an error surfaced without naming a file) and
pins the correct reading or the one-line error naming the file, line or entry instead.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from conftest import laps_args, one_error_line
from patchword.cli import main
from patchword.config import apply_overrides
from patchword.data.karpathy import load_karpathy_json
from patchword.data.laps import load_id_mapping, load_laps_split
from patchword.data.precomp import RegionFeatures, load_precomp_split, load_region_boxes, write_precomp_split
from patchword.data.prepare import prepare_data
from patchword.data.textfiles import load_dense_jsonl
from patchword.data.tokenizers import WordVocab
from patchword.errors import ConfigError, DataError
from patchword.runs.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")

BOM = "\ufeff"


def _write_lines(path: Path, lines: list[str], prefix: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prefix + "".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _precomp_check(root: Path, *extra: str) -> list[str]:
    return [
        "data",
        "check",
        "--split",
        "test",
        "data.dataset=precomp",
        f"data.root={root}",
        "model.image_encoder=precomp",
        "model.text_encoder=gru",
        "model.matcher=scan",
        "model.embed_dim=8",
        "model.gru.word_dim=8",
        "model.precomp.region_dim=16",
        "model.precomp.num_regions=14",
        *extra,
    ]


def _check_rows(out: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] == ["test"]}


# ------------------------------------------------------------------ 1. SCAN features repeated per caption


def _repeated_rows(root: Path, ids: bool = True) -> np.ndarray:
    """The SCAN layout with each of 8 images' features repeated for its 5 captions (40 rows)."""
    feats = np.random.default_rng(0).standard_normal((8, 14, 16)).astype(np.float32)
    caps = [f"a dog {i} view {k}" for i in range(8) for k in range(5)]
    image_ids = [str(1000 + i // 5) for i in range(40)] if ids else None
    write_precomp_split(root, "test", np.repeat(feats, 5, 0), caps, image_ids)
    return feats


def test_precomp_rows_repeated_per_caption_are_read_as_one_image_each(tmp_path, capsys, caplog):
    """`data check` said "40 images 40 captions 1-1 ok": every caption its own image (t2i R@1 72.8 -> 0)."""
    feats = _repeated_rows(tmp_path)
    with caplog.at_level(logging.INFO, logger="patchword.data.precomp"):
        split = load_precomp_split(tmp_path, "test")
    assert "one row per caption" in caplog.text and "read as 8 images" in caplog.text
    assert split.images.shape == (8, 14, 16) and isinstance(split.images, np.memmap)
    assert split.image_ids == [str(1000 + i) for i in range(8)]
    assert split.txt2img.tolist() == [i // 5 for i in range(40)]
    np.testing.assert_array_equal(RegionFeatures(split.images).batch(np.array([3, 7]), False), feats[[3, 7]])
    assert main(_precomp_check(tmp_path)) == 0
    assert _check_rows(capsys.readouterr().out)["test"][2:5] == ["8", "40", "5-5"]
    # without an ids file the rows themselves come in runs of 5 copies
    (tmp_path / "test_ids.txt").unlink()
    split = load_precomp_split(tmp_path, "test", mmap=False)
    assert split.images.shape == (8, 14, 16) and split.txt2img.tolist() == [i // 5 for i in range(40)]
    np.testing.assert_array_equal(split.images, feats)
    # the boxes of such a directory repeat the same way
    boxes = np.repeat(np.random.default_rng(1).uniform(0, 1, (8, 14, 4)).astype(np.float32), 5, 0)
    np.save(tmp_path / "test_boxes.npy", boxes)
    np.testing.assert_array_equal(load_region_boxes(tmp_path, "test", split.images.shape), boxes[::5])


def test_precomp_ids_repeated_outside_equal_runs_are_refused_naming_the_lines(tmp_path):
    """One id per image with a repeated id (7, 7, 8, 9) was read as four images, two of them one image."""
    rng = np.random.default_rng(0)
    write_precomp_split(tmp_path, "test", rng.random((4, 2, 3), dtype=np.float32), ["a b"] * 4)
    ids = _write_lines(tmp_path / "test_ids.txt", ["7", "7", "8", "9"])
    with pytest.raises(DataError, match=rf"^{ids}:2: image id '7' repeats line 1; with one id per image"):
        load_precomp_split(tmp_path, "test", captions_per_image=1)
    # one row per image and five captions each: the same
    write_precomp_split(tmp_path, "test", rng.random((4, 2, 3), dtype=np.float32), ["a b"] * 20, list("7789"))
    with pytest.raises(DataError, match=rf"^{ids}:2: image id '7' repeats line 1"):
        load_precomp_split(tmp_path, "test")


def test_precomp_ids_in_runs_over_rows_that_differ_are_refused(tmp_path):
    rng = np.random.default_rng(0)
    caps = [f"c {k}" for k in range(6)]
    write_precomp_split(tmp_path, "test", rng.random((6, 2, 3), dtype=np.float32), caps, list("aabbcc"))
    with pytest.raises(
        DataError, match=r"test_ims\.npy: row 1 differs from row 0, the first of its run of 2"
    ):
        load_precomp_split(tmp_path, "test")


# ------------------------------------------------------------------ 2. a partial ids or features file


def test_laps_ids_of_part_of_the_images_are_refused_not_divided_out(tmp_path, capsys):
    """Ids of the first 10 of 20 images beside 100 captions: "10 images 100 captions 10-10 ok", image k
    holding the captions of images 2k and 2k + 1."""
    data = tmp_path / "data"
    caps = _write_lines(
        data / "train_caps.txt", [f"a dog {i} caption {k}" for i in range(20) for k in range(5)]
    )
    ids = _write_lines(data / "train_ids.txt", [str(i) for i in range(10)])
    message = (
        f"{caps} has 100 captions but {ids} has 10 ids (one per image): 10 captions per image, more than "
        "data.captions_per_image=5"
    )
    with pytest.raises(DataError) as err:
        load_laps_split(data, "train", None)
    assert str(err.value).startswith(message)
    assert load_laps_split(data, "train", None, captions_per_image=10).num_images == 10  # when it is so
    _write_lines(data / "train_ids.txt", [str(i) for i in range(20)])
    assert load_laps_split(data, "train", None).txt2img.tolist() == [i // 5 for i in range(100)]
    # through the data section: refused, and accepted with data.captions_per_image
    _write_lines(data / "train_ids.txt", [str(i) for i in range(10)])
    (data / "id_mapping.json").write_text(json.dumps({str(i): f"{i}.jpg" for i in range(20)}))
    cfg = apply_overrides(
        RunConfig(), ["data.dataset=laps", f"data.root={data}", "data.image_root=x", "data.dense=false"]
    )
    with pytest.raises(DataError, match="more than data.captions_per_image=5"):
        prepare_data(cfg.data, roles=["train"])
    cfg.data.captions_per_image, cfg.data.check_images = 10, False
    assert prepare_data(cfg.data, roles=["train"]).splits["train"].num_images == 10


def test_precomp_features_of_part_of_the_images_are_refused(tmp_path, capsys):
    """2 feature rows beside the 20 captions of 4 images were read as 10 captions per image."""
    rng = np.random.default_rng(0)
    caps = [f"a dog {i} caption {k}" for i in range(4) for k in range(5)]
    write_precomp_split(tmp_path, "test", rng.random((2, 14, 16), dtype=np.float32), caps)
    assert main(_precomp_check(tmp_path)) == 2
    out = capsys.readouterr().out
    assert (
        f"error: {tmp_path / 'test_caps.txt'}: 20 captions for 2 images in test_ims.npy: 10 captions per "
        "image, more than data.captions_per_image=5"
    ) in out
    assert main(_precomp_check(tmp_path, "data.captions_per_image=10")) == 0
    assert _check_rows(capsys.readouterr().out)["test"][2:5] == ["2", "20", "10-10"]
    with pytest.raises(ConfigError, match=r"data\.captions_per_image: must be at least 1, got 0"):
        apply_overrides(RunConfig(), ["data.captions_per_image=0"])


# ------------------------------------------------------------------ 3. one image under two indices


def test_laps_two_ids_mapping_to_one_file_are_refused(tmp_path):
    data = tmp_path / "data"
    _write_lines(data / "test_caps.txt", ["a", "b", "c", "d", "e", "f"])
    ids = _write_lines(data / "test_ids.txt", ["1", "1", "2", "2", "3", "3"])
    mapping = data / "id_mapping.json"
    mapping.write_text(json.dumps({"1": "a.jpg", "2": "b.jpg", "3": "./a.jpg"}))
    with pytest.raises(DataError) as err:
        load_laps_split(data, "test", None)
    assert str(err.value).startswith(
        f"{mapping}: ids '1' ({ids}:1) and '3' ({ids}:5) both map to './a.jpg': one image under two ids"
    )


@pytest.mark.parametrize("shared", ["cocoid", "filename"])
def test_karpathy_one_image_listed_twice_is_refused(tmp_path, shared):
    entries = [
        {"split": "test", "filename": f"{i}.jpg", "cocoid": i, "sentences": [{"raw": f"c{i}"}]}
        for i in range(3)
    ]
    entries[2][shared] = entries[0][shared]
    path = tmp_path / "dataset_coco.json"
    path.write_text(
        json.dumps({"images": [{"split": "train", "filename": "t.jpg", "sentences": []}, *entries]})
    )
    what = "id '0'" if shared == "cocoid" else "file '0.jpg'"
    with pytest.raises(DataError, match=rf"^{path}: images\[1\] and images\[3\] have the same {what}"):
        load_karpathy_json(path, "test", None)


def test_precomp_one_id_per_image_repeated_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    caps = [f"c {k}" for k in range(15)]
    write_precomp_split(tmp_path, "test", rng.random((3, 2, 3), dtype=np.float32), caps, ["a", "b", "a"])
    with pytest.raises(DataError, match=rf"^{tmp_path / 'test_ids.txt'}:3: image id 'a' repeats line 1"):
        load_precomp_split(tmp_path, "test")


# ------------------------------------------------------------------ 4. a UTF-8 byte order mark


def test_a_byte_order_mark_is_not_part_of_the_first_id_or_caption(tmp_path):
    """ids came out as '\\ufeff0' (image 0 split in two) and the json files were refused."""
    data = tmp_path / "data"
    _write_lines(data / "test_caps.txt", ["a dog", "a dog running", "a cat", "a cat sleeping"], prefix=BOM)
    _write_lines(data / "test_ids.txt", ["0", "0", "1", "1"], prefix=BOM)
    (data / "id_mapping.json").write_text(BOM + json.dumps({"0": "0.jpg", "1": "1.jpg"}), encoding="utf-8")
    dense = _write_lines(tmp_path / "d.jsonl", [json.dumps({"text": t}) for t in ("dog", "cat")], prefix=BOM)
    split = load_laps_split(data, "test", None, dense_jsonl=dense)
    assert split.image_ids == ["0", "1"] and split.captions[0] == "a dog"
    assert split.images == ["0.jpg", "1.jpg"] and split.txt2img.tolist() == [0, 0, 1, 1]
    assert load_id_mapping(data / "id_mapping.json") == {"0": "0.jpg", "1": "1.jpg"}
    assert load_dense_jsonl(dense) == ["dog", "cat"]
    karpathy = tmp_path / "dataset_f30k.json"
    entry = {"split": "test", "filename": "0.jpg", "imgid": 0, "sentences": [{"raw": "a dog"}]}
    karpathy.write_text(BOM + json.dumps({"images": [entry]}), encoding="utf-8")
    assert load_karpathy_json(karpathy, "test", None).image_ids == ["0"]
    vocab = tmp_path / "vocab.json"
    WordVocab(["dog"]).save(vocab)
    vocab.write_text(BOM + vocab.read_text(encoding="utf-8"), encoding="utf-8")
    assert WordVocab.load(vocab).idx2word[-1] == "dog"


# ------------------------------------------------------------------ 5. a caption without words


def _reword(path: Path, line: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")


def test_a_caption_without_words_is_named_by_file_and_line(laps_dataset, tmp_path, capsys):
    """train and eval failed with "text 2 is empty (no words): '. . .'", naming no file, split or line (the
    index counted over captions and dense captions); `data check` said ok."""
    root = laps_dataset["root"]
    _reword(root / "test_caps.txt", 3, ". . .")
    assert main(["data", "check", *laps_args(laps_dataset, "data.dense=false")]) == 2
    out = capsys.readouterr().out
    assert f"error: {root / 'test_caps.txt'}:3: the caption '. . .' has no words" in out
    runs = tmp_path / "runs"
    args = laps_args(laps_dataset, "data.dense=false", f"output_dir={runs}", "name=r")
    assert main(["train", *args]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        f"error: {root / 'test_caps.txt'}:3: the caption '. . .' has no words"
    )
    assert not runs.exists()
    # in the training text, after the held-out images left it: still the file's own line
    _reword(root / "test_caps.txt", 3, "a red circle")
    _reword(root / "train_caps.txt", 14, "!!")
    assert main(["train", *args, "data.dev_from_train=2"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        f"error: {root / 'train_caps.txt'}:14: the caption '!!' has no words"
    )


def test_a_dense_or_karpathy_caption_without_words_is_named_where_it_was_read(laps_dataset, tmp_path):
    dense = laps_dataset["dense_train"]
    _reword(dense, 5, json.dumps({"text": "..."}))
    cfg = apply_overrides(
        RunConfig(),
        laps_args(laps_dataset, "model.matcher=seps", f"data.dense_train={dense}", "data.dev_from_train=2")
        + [f"data.dense_test={laps_dataset['dense_test']}"],
    )
    with pytest.raises(DataError, match=rf"^{dense}:5: the dense caption '\.\.\.' has no words"):
        prepare_data(cfg.data, roles=["train"])
    path = tmp_path / "dataset_coco.json"
    entries = [
        {"split": "test", "filename": f"{i}.jpg", "cocoid": i, "sentences": [{"raw": "a dog"}, {"raw": "-"}]}
        for i in range(2)
    ]
    path.write_text(
        json.dumps({"images": [{"split": "train", "filename": "t.jpg", "sentences": []}, *entries]})
    )
    cfg = apply_overrides(
        RunConfig(), ["data.dataset=karpathy", f"data.root={path}", "data.image_root=x", "data.dense=false"]
    )
    cfg.data.check_images = False
    with pytest.raises(
        DataError, match=rf"^{path}: images\[1\]\.sentences\[1\]: the caption '-' has no words"
    ):
        prepare_data(cfg.data, WordVocab(["dog"]), roles=["test"])


# ------------------------------------------------------------------ 6. SCAN's own vocabulary


def test_a_scan_vocabulary_without_a_split_reads_punctuation_as_scan_does(tmp_path, caplog):
    """SCAN's vocab.json (no "split" key) was read with the alnum split: "t-shirt", ".", ",", "'s" never
    matched, so those caption words all became <unk>."""
    pytest.importorskip("nltk")
    words = ["a", "man", "in", "t-shirt", ".", ",", "'s", "dog"]
    specials = ["<pad>", "<start>", "<end>", "<unk>"]
    all_words = specials + words
    path = tmp_path / "f30k_precomp_vocab.json"
    path.write_text(
        json.dumps(
            {
                "word2idx": {w: i for i, w in enumerate(all_words)},
                "idx2word": {str(i): w for i, w in enumerate(all_words)},
                "idx": len(all_words),
            }
        )
    )
    with caplog.at_level(logging.INFO, logger="patchword.data.tokenizers.word"):
        vocab = WordVocab.load(path)
    assert vocab.split == "treebank" and "treebank" in caplog.text
    assert vocab.known_and_unknown_words("A man's t-shirt, a dog.") == (
        ["a", "man", "'s", "t-shirt", ",", "dog", "."],
        [],
    )
    # patchword's own (alnum) vocabulary records no split either: it keeps the alnum split
    WordVocab(["a", "man", "t", "shirt"]).save(path)
    assert WordVocab.load(path).split == "alnum"


# ------------------------------------------------------------------ 7. words of any script


def test_the_unicode_word_split_reads_every_script_consistently(tmp_path):
    """alnum dropped the accent of a decomposed 'cafe\\u0301' (another word than 'café'), cut Hindi words at
    their vowel signs and made a Chinese caption one word; the unicode split (recorded in vocab.json) does
    neither, and alnum vocabularies keep their tokens."""
    texts = ["cafe\u0301 and café", "हिन्दी भाषा", "一只狗"]
    vocab = WordVocab.build(texts, split="unicode")
    assert vocab.idx2word[4:] == ["café", "and", "भाषा", "हिन्दी", "一", "只", "狗"]
    vocab.save(tmp_path / "vocab.json")
    loaded = WordVocab.load(tmp_path / "vocab.json")
    assert loaded.split == "unicode" and loaded.encode("Café 狗") == [1, 4, 10, 2]
    assert WordVocab.build(texts).idx2word[4:] == ["and", "cafe", "café", "द", "न", "भ", "ष", "ह", "一只狗"]
    data = tmp_path / "data"
    _write_lines(data / "train_caps.txt", ["一只狗", "一只猫"])
    _write_lines(data / "train_ids.txt", ["0", "1"])
    cfg = apply_overrides(
        RunConfig(),
        [
            "data.dataset=laps",
            f"data.root={data}",
            "data.dense=false",
            "data.word_split=unicode",
            "data.captions_per_image=1",
        ],
    )
    cfg.data.image_root, cfg.data.check_images = "x", False
    (data / "id_mapping.json").write_text(json.dumps({"0": "0.jpg", "1": "1.jpg"}))
    prepared = prepare_data(cfg.data, roles=["train"])
    assert prepared.tokenizer.split == "unicode" and len(prepared.tokenizer) == 4 + 4
