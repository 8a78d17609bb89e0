"""A precomp split with one feature row and one id per caption whose id runs are uneven (a line left out
here, one added there: every caption after it on another image) names the first broken run. Old code said
"1 caption per image, fewer than data.captions_per_image=5 ... set data.captions_per_image=1", which would
have read each caption as its own image."""

from __future__ import annotations

import numpy as np
import pytest

from patchword.data.precomp import load_precomp_split, write_precomp_split
from patchword.errors import DataError

WHY = (
    ", where most runs have 5: with one id per caption (and one feature row per caption) each image's lines "
    "repeat its id, so a line left out or added there moves every caption after it onto another image; mend "
    "the ids file"
)


def _split(root, runs: dict[str, int]):
    """One feature row and one caption per line of the ids file; ``runs``: each id and its line count."""
    ids = [image_id for image_id, count in runs.items() for _ in range(count)]
    features = np.random.default_rng(0).random((len(runs), 3, 4), dtype=np.float32)
    rows = np.repeat(features, list(runs.values()), axis=0)
    write_precomp_split(root, "test", rows, [f"caption {k}" for k in range(len(ids))])
    (root / "test_ids.txt").write_text("".join(f"{i}\n" for i in ids))
    return root / "test_ids.txt"


@pytest.mark.parametrize(
    ("runs", "broken"),
    [
        # the first image's fifth line went to the last image
        ({"a": 4, "b": 5, "c": 5, "d": 6}, "5: id 'b' ends the run of id 'a' from line 1 after 4 lines"),
        (
            {"a": 5, "b": 6, "c": 5, "d": 4},
            "11: the run of id 'b' from line 6 goes on past 5 lines (6 lines)",
        ),
        ({"a": 5, "b": 5, "c": 5, "d": 3}, "18: the file ends 3 lines into the run of id 'd' from line 16"),
    ],
)
def test_uneven_runs_of_ids_per_caption_name_the_first_broken_run(tmp_path, runs, broken):
    ids = _split(tmp_path, runs)
    with pytest.raises(DataError) as caught:
        load_precomp_split(tmp_path, "test")
    assert str(caught.value) == f"{ids}:{broken}{WHY}"


def test_even_runs_still_read_one_row_per_image(tmp_path):
    _split(tmp_path, {"a": 5, "b": 5, "c": 5})
    split = load_precomp_split(tmp_path, "test")
    assert split.image_ids == ["a", "b", "c"] and split.txt2img.tolist() == [k // 5 for k in range(15)]


def test_one_id_per_image_with_one_repeat_is_still_a_caption_count_question(tmp_path):
    """Mostly single lines (one id per image, one caption each): the caption count is what to set, and with
    data.captions_per_image=1 the repeated id is named."""
    ids = _split(tmp_path, {"a": 2, "b": 1, "c": 1, "d": 1})
    with pytest.raises(DataError, match=r"1 caption per image, fewer than data\.captions_per_image=5"):
        load_precomp_split(tmp_path, "test")
    with pytest.raises(DataError, match=rf"^{ids}:2: image id 'a' repeats line 1"):
        load_precomp_split(tmp_path, "test", captions_per_image=1)
