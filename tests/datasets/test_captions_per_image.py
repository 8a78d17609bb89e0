"""``data.captions_per_image`` is exact where the files give one id (or feature row) per image.

The readers refused only more captions per image than it says; a captions file cut short at a multiple of
the image count (10 ids or feature rows beside 20 of their 50 captions) was read as 2 captions per image,
moving caption 2 onwards onto the wrong image.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from patchword.cli import main
from patchword.data.laps import load_laps_split
from patchword.data.precomp import load_precomp_split, write_precomp_split
from patchword.errors import DataError

pytestmark = pytest.mark.usefixtures("one_thread")


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _laps(root: Path, n_img: int, n_caps: int) -> tuple[Path, Path]:
    """Ids of ``n_img`` images (one line each) beside the first ``n_caps`` of their 5 captions each."""
    caps = [f"a dog {i} caption {k}" for i in range(n_img) for k in range(5)][:n_caps]
    return _write_lines(root / "train_caps.txt", caps), _write_lines(
        root / "train_ids.txt", list(map(str, range(n_img)))
    )


def test_laps_captions_cut_short_at_a_multiple_of_the_ids_are_refused(tmp_path):
    caps, ids = _laps(tmp_path, 10, 20)
    with pytest.raises(DataError) as err:
        load_laps_split(tmp_path, "train", None)
    assert str(err.value) == (
        f"{caps} has 20 captions but {ids} has 10 ids (one per image): 2 captions per image, fewer than "
        "data.captions_per_image=5; a captions file cut short would move captions onto other images; set "
        "data.captions_per_image=2 if each image has 2 captions"
    )
    # when each image does have 2 captions, the setting says so
    assert load_laps_split(tmp_path, "train", None, captions_per_image=2).txt2img.tolist() == [
        i // 2 for i in range(20)
    ]
    # the complete file reads as before
    _laps(tmp_path, 10, 50)
    assert load_laps_split(tmp_path, "train", None).txt2img.tolist() == [i // 5 for i in range(50)]


def test_laps_as_many_distinct_ids_as_captions_need_one_caption_per_image(tmp_path):
    """10 ids and the first 10 of their 50 captions: as many lines, so each caption went to its own image."""
    caps, ids = _laps(tmp_path, 10, 10)
    with pytest.raises(
        DataError,
        match=r"1 caption per image, fewer than data.captions_per_image=5; .* set "
        r"data.captions_per_image=1 if each image has 1 caption$",
    ):
        load_laps_split(tmp_path, "train", None)
    assert load_laps_split(tmp_path, "train", None, captions_per_image=1).num_images == 10
    # a caller that reads only the images (densify) checks no count
    assert load_laps_split(tmp_path, "train", None, captions_per_image=None).num_images == 10
    # ids repeated per caption (the dev / test layout) group the captions whatever their count
    _write_lines(ids, [str(i // 2) for i in range(10)])
    assert load_laps_split(tmp_path, "train", None).txt2img.tolist() == [i // 2 for i in range(10)]


def test_precomp_captions_cut_short_are_refused(tmp_path):
    rng = np.random.default_rng(0)
    caps = [f"a dog {i} caption {k}" for i in range(10) for k in range(5)]
    write_precomp_split(tmp_path, "test", rng.random((10, 2, 3), dtype=np.float32), caps[:20])
    with pytest.raises(DataError) as err:
        load_precomp_split(tmp_path, "test")
    assert str(err.value) == (
        f"{tmp_path / 'test_caps.txt'}: 20 captions for 10 images in test_ims.npy: 2 captions per image, "
        "fewer than data.captions_per_image=5; a captions file cut short would move captions onto other "
        "images; set data.captions_per_image=2 if each image has 2 captions"
    )
    assert load_precomp_split(tmp_path, "test", captions_per_image=2).txt2img.tolist() == [
        i // 2 for i in range(20)
    ]
    # as many distinct rows (and ids) as captions: one caption per image only when the setting says so
    write_precomp_split(
        tmp_path, "test", rng.random((10, 2, 3), dtype=np.float32), caps[:10], list("abcdefghij")
    )
    with pytest.raises(
        DataError, match=r"test_ims.npy and test_ids.txt lists 10 ids: 1 caption per image, fewer"
    ):
        load_precomp_split(tmp_path, "test")
    assert load_precomp_split(tmp_path, "test", captions_per_image=1).image_ids == list("abcdefghij")


def test_a_short_captions_file_is_one_error_line_at_the_cli(tmp_path, capsys):
    rng = np.random.default_rng(0)
    caps = [f"a dog {i} caption {k}" for i in range(4) for k in range(5)]
    write_precomp_split(tmp_path, "test", rng.random((4, 14, 16), dtype=np.float32), caps[:8])
    args = [
        "data",
        "check",
        "--split",
        "test",
        "data.dataset=precomp",
        f"data.root={tmp_path}",
        "model.image_encoder=precomp",
        "model.text_encoder=gru",
        "model.matcher=scan",
        "model.embed_dim=8",
        "model.gru.word_dim=8",
        "model.precomp.region_dim=16",
        "model.precomp.num_regions=14",
    ]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert (
        f"error: {tmp_path / 'test_caps.txt'}: 8 captions for 4 images in test_ims.npy: 2 captions per "
        "image, fewer than data.captions_per_image=5"
    ) in captured.out + captured.err
    assert main([*args, "data.captions_per_image=2"]) == 0
