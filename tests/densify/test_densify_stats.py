"""densify stats: counts, duplicates, length percentiles, BERT tokens, and synthetic scene coverage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchword.cli.densify import main
from patchword.data.synthetic import COLOURS, SHAPES, SyntheticConfig, generate_split
from patchword.data.tokenizers import BertCaptionTokenizer
from patchword.densify.stats import dense_stats, mentioned_pairs, read_texts, scene_coverage, scene_index
from patchword.errors import DataError
from project_paths import SHARED_DATA

pytestmark = pytest.mark.usefixtures("one_thread")

RELEASED = SHARED_DATA / "seps_dense_llava"

TEXTS = [
    "A red circles.",
    "",
    "big red circle",
    "big red circle",
    "big red circle",
    "one two three four five six",
]


def _write(path: Path, texts, ids=None, truncated=None) -> Path:
    with path.open("w") as f:
        for k, text in enumerate(texts):
            meta = {} if ids is None else {"image_id": ids[k]}
            if truncated is not None:
                meta["truncated"] = truncated[k]
            f.write(json.dumps({"text": text, "model_id": "m" if k < 4 else "n", "metadata": meta}) + "\n")
    return path


@pytest.fixture
def vocab_file(tmp_path) -> Path:
    path = tmp_path / "vocab.txt"
    path.write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "red", "circle", "##s", "big"])
    )
    return path


def test_counts_duplicates_and_word_lengths(tmp_path):
    path = _write(
        tmp_path / "d.jsonl",
        TEXTS,
        ids=["x0", "x1", "x2", "x3", "x3", "x5"],
        truncated=[True] * 2 + [False] * 4,
    )
    report = dense_stats(read_texts(path), token_limits=(6,))
    assert report["count"] == 6 and report["empty"] == 1
    assert report["duplicate_lines"] == 2 and report["duplicated_texts"] == 1
    assert report["duplicate_image_ids"] == 1 and report["truncated"] == 2
    assert report["model_ids"] == {"m": 4, "n": 2}
    words = report["words"]  # word counts 3, 0, 3, 3, 3, 6
    assert (words["min"], words["p50"], words["mean"], words["max"]) == (0, 3, 3.0, 6)
    assert words["p5"] == pytest.approx(0.75)  # linear interpolation between 0 and 3
    # no vocabulary: BERT basic tokens + [CLS]/[SEP], a lower bound: 6, 2, 5, 5, 5, 8
    assert not report["bert_tokens_exact"]
    assert report["bert_tokens"]["max"] == 8 and report["bert_tokens"]["p50"] == 5
    assert report["over_limit"] == {"6": pytest.approx(1 / 6)}


def test_exact_bert_tokens_with_a_vocabulary(tmp_path, vocab_file, capsys):
    path = _write(tmp_path / "d.jsonl", TEXTS)
    report = dense_stats(
        read_texts(path), bert=BertCaptionTokenizer.from_pretrained(vocab_file), token_limits=(6,)
    )
    # "a red circle ##s [UNK]" -> 7, "" -> 2, "big red circle" -> 5 (x3), six unknown words -> 8
    assert report["bert_tokens_exact"]
    assert (report["bert_tokens"]["min"], report["bert_tokens"]["p50"], report["bert_tokens"]["max"]) == (
        2,
        5,
        8,
    )
    assert report["bert_tokens"]["mean"] == pytest.approx((7 + 2 + 5 * 3 + 8) / 6)
    assert report["over_limit"] == {"6": pytest.approx(2 / 6)}
    assert report["duplicate_image_ids"] is None  # the lines carry no ids
    assert main(["stats", str(path), "--bert-vocab", str(vocab_file), "--token-limits", "6"]) == 0
    printed = capsys.readouterr().out
    assert "6 descriptions" in printed and "empty 1, duplicate lines 2" in printed and "> 6: 33.3%" in printed


def test_torn_tail_and_malformed_lines(tmp_path):
    path = _write(tmp_path / "d.jsonl", ["one", "two"])
    path.write_bytes(path.read_bytes() + b'{"text": "thr')
    data = read_texts(path)
    assert data.texts == ["one", "two"] and data.torn_bytes == len(b'{"text": "thr')
    path.write_text('{"text": "ok"}\n{"nope": 1}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:2: expected an object with a string field 'text'"):
        read_texts(path)


@pytest.mark.parametrize(
    "text,expected",
    [
        (
            "A small red circle sits next to a large blue square.",
            {("red", "circle"): 1, ("blue", "square"): 1},
        ),
        ("Two red circles and a green cross.", {("red", "circle"): 1, ("green", "cross"): 1}),
        ("Red and blue circles.", {("blue", "circle"): 1}),
        ("Crosses: a black one. Black crosses!", {("black", "cross"): 1}),
        ("A red, rather shiny circle", {("red", "circle"): 1}),
        ("A red thing that is not quite a circle", {}),  # too far apart
        ("The orange square is left of the orange square.", {("orange", "square"): 2}),
    ],
)
def test_mentioned_pairs(text, expected):
    colours = tuple(COLOURS)
    found = mentioned_pairs(text, SHAPES, colours)
    assert {(colours[c], SHAPES[s]): n for (c, s), n in found.items()} == expected


def test_scene_coverage_of_the_generators_own_dense_captions_matches_its_records():
    config = SyntheticConfig(num_test=150)
    split = generate_split(config, "test")
    coverage = scene_coverage(split.dense_captions, range(150), split.scenes, config.shapes, config.colours)
    expected, invented = [], []
    specs = split.dense_specs
    for i in range(150):
        said = {(int(specs.colour[i, c]), int(specs.shape[i, c])) for c in range(9) if specs.mentioned[i, c]}
        scene = [(colour, shape) for _, shape, colour, _ in split.scenes.objects(i)]
        expected.append((sum(pair in said for pair in scene), len(scene)))
        invented.append(len(said - set(scene)))
    assert coverage["per_description"] == expected
    assert coverage["invented_per_description"] == pytest.approx(sum(invented) / 150)
    assert coverage["objects"] == int(split.scenes.count.sum())
    # the generator omits objects (15%) and gets attributes wrong (10%): most, not all, are named
    assert 0.7 < coverage["named_share"] < 0.95


def test_scene_index():
    assert scene_index("syn-test-000012", "test") == 12
    assert scene_index("export/syn-test-000012.png", "test") == 12
    assert scene_index("7", "test") == 7 and scene_index("000031.png", "dev") == 31
    with pytest.raises(DataError, match="belongs to the synthetic dev split"):
        scene_index("syn-dev-1", "test")
    with pytest.raises(DataError, match="names no synthetic scene"):
        scene_index("cat.png", "test")


def test_stats_cli_on_synthetic_files(tmp_path, capsys):
    """A densify --synthetic output is recognised from its sidecar; --synthetic-split for other files."""
    out = tmp_path / "syn.jsonl"
    run = [
        "--synthetic",
        "test",
        "--synthetic-num-images",
        "12",
        "--model",
        "tiny-random",
        "--max-new-tokens",
        "8",
    ]
    assert main([*run, "--batch-size", "6", "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["stats", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)[str(out)]  # keyed by path, one file or several
    scenes = generate_split(SyntheticConfig(num_test=12), "test").scenes
    assert report["count"] == 12 and report["scenes"]["descriptions"] == 12
    assert report["scenes"]["objects"] == int(scenes.count.sum())
    # the generator's own captions under exported-file ids, with the split given by flag
    config = SyntheticConfig(num_test=20)
    split = generate_split(config, "test")
    ids = [f"{image_id}.png" for image_id in split.image_ids]
    plain = _write(tmp_path / "generator.jsonl", split.dense_captions, ids=ids)
    flags = ["--synthetic-split", "test", "--synthetic-num-images", "20"]
    assert main(["stats", str(plain), *flags, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)[str(plain)]
    truth = scene_coverage(split.dense_captions, range(20), split.scenes, config.shapes, config.colours)
    assert report["scenes"]["named"] == truth["named"] and report["scenes"]["objects"] == truth["objects"]
    assert main(["stats", str(plain), *flags]) == 0
    assert f"named {truth['named']} of {truth['objects']} objects" in capsys.readouterr().out
    # ids that name no scene: one error line
    bad = _write(tmp_path / "bad.jsonl", ["a red circle"], ids=["cat.png"])
    assert main(["stats", str(bad), *flags]) == 2
    assert "names no synthetic scene" in capsys.readouterr().err


@pytest.mark.skipif(not RELEASED.is_dir(), reason="shared/data/seps_dense_llava not present")
def test_released_llava_files_match_the_reference_notes():
    """reference/seps_laps.md: median ~100 words, basic-token median 114 and max 173, 94.8% over 90."""
    f30k = dense_stats(read_texts(RELEASED / "f30k_test.jsonl"))
    assert f30k["count"] == 1000 and f30k["empty"] == 0 and f30k["duplicate_lines"] == 0
    assert (
        f30k["words"]["p50"] == 100
        and f30k["bert_tokens"]["p50"] == 114
        and f30k["bert_tokens"]["max"] == 173
    )
    assert f30k["over_limit"]["90"] == pytest.approx(0.948)
    assert f30k["model_ids"] == {"llava-v1-0719-336px-lora-merge-vicuna-13b-v1.3": 1000}
