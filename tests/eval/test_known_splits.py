"""Which published test split a split's captions are, by their text (``patchword.eval.known_splits``), and
the published-vs-measured caveat that reads it instead of ``data.root``'s folder names.

The shipped hashes are checked against the public caption files in ``shared/data`` they were made from
(``benchmarks/make_known_splits.py``), in the forms users have them: SCAN's tokenised files, Multi30K's raw
Flickr30K captions (HTML entities, other punctuation), and each split's TSV."""

from __future__ import annotations

import csv
import gzip

import numpy as np
import pytest

from patchword.eval.known_splits import (
    KNOWN_SPLITS,
    _known_hashes,
    caption_hashes,
    caption_key,
    identify_captions,
)
from patchword.imports.published import caveats, published_results
from project_paths import SHARED_DATA

pytestmark = pytest.mark.usefixtures("one_thread")

needs_shared = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"real caption files not available ({SHARED_DATA} is absent)"
)
MEASURED = dict(i2t_r1=80.0, i2t_r5=90.0, i2t_r10=95.0, t2i_r1=70.0, t2i_r5=85.0, t2i_r10=90.0, rsum=510.0)


def _lines(path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _tsv(path, column: str) -> list[str]:
    with open(path, encoding="utf-8", newline="") as fh:
        return [row[column] for row in csv.DictReader(fh, delimiter="\t")]


def test_a_caption_has_one_key_however_it_is_tokenised_or_escaped():
    forms = [
        "A man in a black jacket &amp; jeans can't wait .",
        "a man in a black jacket & jeans can't wait.",
        "A man in a black jacket &amp;amp; jeans ca n't wait",
        "A MAN IN A BLACK JACKET JEANS CAN T WAIT",
    ]
    assert {caption_key(text) for text in forms} == {"amaninablackjacketjeanscantwait"}
    assert len(set(caption_hashes(forms).tolist())) == 1
    assert caption_hashes(["a dog"]).dtype == np.uint64 and caption_key("a cat") != caption_key("a dog")


def test_every_known_split_ships_its_distinct_sorted_hashes():
    for name, split in KNOWN_SPLITS.items():
        hashes = _known_hashes(name)
        assert hashes.dtype == np.uint64 and np.all(np.diff(hashes.astype(np.float64)) >= 0)
        assert np.unique(hashes).size == hashes.size and 0.95 * split.captions < hashes.size <= split.captions


@needs_shared
def test_the_public_test_captions_are_identified_in_every_form():
    data = SHARED_DATA
    multi30k = []
    for i in range(1, 6):  # Multi30K's raw Flickr30K test captions, one file per caption number
        with gzip.open(
            data / "f30k_karpathy_multi30k" / f"test_2016.{i}.en.gz", "rt", encoding="utf-8"
        ) as fh:
            multi30k += fh.read().splitlines()
    cases = {
        "f30k_1k_test": [
            _lines(data / "f30k_1k_test" / "test_caps.txt"),
            _tsv(data / "f30k_1k_test" / "f30k_test_captions.tsv", "caption_scan_tokenized"),
            multi30k,
        ],
        "coco_5k_test": [
            _lines(data / "coco_5k_test" / "testall_caps.txt"),
            _tsv(data / "coco_5k_test" / "coco5k_test_captions.tsv", "caption_scan_tokenized"),
        ],
        "f8k_1k_test": [_tsv(data / "flickr8k_text" / "f8k_test_captions.tsv", "caption")],
    }
    for name, forms in cases.items():
        for captions in forms:
            n = len(captions)
            assert identify_captions(captions) == {
                "split": name,
                "dataset": KNOWN_SPLITS[name].dataset,
                "found": n,
                "captions": n,
            }
    # COCO 1K (the first fold, SCAN's test_caps.txt) is COCO 5K test captions but one, whose typo its
    # testall_caps.txt corrects ("cegetables"): a share the caveat takes as the split's; its dev set is not
    fold = _lines(data / "coco_5k_test" / "test_caps.txt")
    assert identify_captions(fold) == {
        "split": "coco_5k_test",
        "dataset": "coco",
        "found": 4999,
        "captions": 5000,
    }
    dev = identify_captions(_lines(data / "coco_5k_test" / "dev_caps.txt"))
    assert dev is None or dev["found"] < 100  # 62: common captions ("a man riding a wave on a surfboard")
    # Flickr8K's images are Flickr30K images: its test shares some captions with Flickr30K's; the best match
    # names the data, the count says how much of it is that split's
    mixed = _tsv(data / "flickr8k_text" / "f8k_test_captions.tsv", "caption")[:100] + cases["f30k_1k_test"][0]
    assert identify_captions(mixed)["split"] == "f30k_1k_test"
    assert identify_captions(mixed)["found"] < len(mixed)


def test_captions_of_no_known_split_are_none():
    assert identify_captions(["a red square left of a blue circle", "two green triangles"]) is None
    assert identify_captions([]) is None


def _naaf_row():
    (row,) = [
        r for r in published_results("naaf", "butd-regions+glove-bigru", "f30k") if r.variant == "single"
    ]
    return row


@pytest.mark.parametrize(
    ("known", "expected"),
    [
        ({"split": "f30k_1k_test", "dataset": "f30k", "found": 5000, "captions": 5000}, None),
        ({"split": "f30k_1k_test", "dataset": "f30k", "found": 4990, "captions": 5000}, None),  # a few typos
        (
            {"split": "coco_5k_test", "dataset": "coco", "found": 5000, "captions": 5000},
            "measured on MS-COCO 5K test captions (5000 of 5000 are its, by their text), the published "
            "Flickr30K 1K row on Flickr30K: not a like-for-like comparison",
        ),
        (
            {"split": "f30k_1k_test", "dataset": "f30k", "found": 4900, "captions": 5000},
            "100 of the 5000 captions measured are not Flickr30K 1K test captions (by their text): not "
            "exactly the published Flickr30K 1K row's data",
        ),
        (None, "none of the 5000 captions measured is a caption of a published test split"),
    ],
)
def test_the_caveat_reads_the_captions_not_the_folder_name(known, expected):
    """A recorded caption match decides, whatever ``data.root`` is called: a folder named ``set1`` holding
    the Flickr30K test is no caveat (it was "names neither Flickr30K nor MS-COCO"), one named
    ``flickr30k`` holding COCO captions is one (it was none)."""
    record = {"split": "test", "images": 1000, "captions": 5000, "leaky": False, **MEASURED}
    for root in ("/mnt/set1", "/mnt/flickr30k_precomp"):
        data = {"dataset": "precomp", "root": root, "test_split": "test", "dev_split": "dev"}
        found = caveats(_naaf_row(), {**record, "known_captions": known}, data)
        assert found == ([] if expected is None else [found[0]]) and (
            expected is None or expected in found[0]
        )


@pytest.mark.parametrize(
    "damaged",
    [
        {"split": "f30k_1k_test", "found": 6000, "captions": 5000},  # more found than measured
        {"split": "imagenet", "found": 1, "captions": 5000},
        {"split": "f30k_1k_test", "found": "5000", "captions": 5000},
        [1, 2],
    ],
)
def test_a_damaged_match_falls_back_to_the_folder_name(damaged):
    record = {"split": "test", "images": 1000, "captions": 5000, "leaky": False, **MEASURED}
    data = {"dataset": "precomp", "root": "/mnt/set1", "test_split": "test", "dev_split": "dev"}
    (found,) = caveats(_naaf_row(), {**record, "known_captions": damaged}, data)
    assert found.startswith("data.root `/mnt/set1` names neither Flickr30K nor MS-COCO")
