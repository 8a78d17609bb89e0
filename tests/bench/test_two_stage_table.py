"""The ``bench two-stage`` table says which first stage ranked the shortlists (old code: nothing, so an IVF
run's rSum read as the exact search's) and the k each row used (old code: the k asked for, 128 on a test
split of 24 images, whose shortlists held 24)."""

from __future__ import annotations

from patchword.bench import format_two_stage

ROWS = [
    {"method": "exhaustive", "k": None, "alpha": 0.0, "pairs": 2880, "seconds": 0.5}
    | {"rsum": 126.7, "i2t_r1": 4.2, "t2i_r1": 7.5},
    {"method": "two-stage", "k": 16, "alpha": 0.0, "pairs": 2047, "seconds": 0.2, "speedup": 2.5}
    | {"rsum_delta": -0.8, "rsum": 125.9, "i2t_r1": 4.2, "t2i_r1": 6.7},
    {"method": "two-stage", "k": 64, "alpha": 0.0, "pairs": 2880, "seconds": 0.2, "speedup": 2.5}
    | {"rsum_delta": -4.2, "rsum": 122.5, "i2t_r1": 4.2, "t2i_r1": 7.5},
    {"method": "two-stage", "k": 128, "alpha": 1.0, "pairs": 2880, "seconds": 0.2, "speedup": 2.5}
    | {"rsum_delta": 0.8, "rsum": 127.5, "i2t_r1": 4.2, "t2i_r1": 7.5},
]
MODEL = {"test_images": 24, "test_captions": 120}


def test_the_table_names_an_approximate_first_stage_and_shows_the_k_used():
    lines = format_two_stage({"rows": ROWS, "model": MODEL, "backend": "faiss_ivf"}).splitlines()
    assert [line.split(" | ")[1] for line in lines[2:6]] == ["all", "16", "64 / 24", "120 / 24"]
    assert lines[7] == (
        "First stage: faiss_ivf (APPROXIMATE: a shortlist may miss candidates the exact one holds, so rSum "
        "is not the exact two-stage search's)."
    )
    assert lines[8] == (
        "k is the shortlist length used, clipped to the candidates each direction ranks (120 test captions "
        "for i2t, 24 test images for t2i; i2t / t2i where they differ): k = 64, 128 were asked for."
    )


def test_an_exact_first_stage_is_named_and_unclipped_ks_are_shown_as_asked():
    big = {"test_images": 1000, "test_captions": 5000}
    lines = format_two_stage({"rows": ROWS, "model": big, "backend": "exact"}).splitlines()
    assert [line.split(" | ")[1] for line in lines[2:6]] == ["all", "16", "64", "128"]
    assert lines[6:] == ["", "First stage: exact (matrix product and top-k)."]
    flat = format_two_stage({"rows": ROWS, "model": big, "backend": "faiss_flat"}).splitlines()
    assert flat[-1] == "First stage: faiss_flat (exact)."


def test_the_table_shows_the_k_each_row_recorded_as_used():
    """Old code: the table computed the k used from the test counts alone, and the result recorded only the k
    asked for: a result whose rows say what they used (``k_used``) without the counts showed the k asked."""
    used = [None, {"i2t": 16, "t2i": 16}, {"i2t": 64, "t2i": 24}, {"i2t": 120, "t2i": 24}]
    rows = [row | {"k_used": k_used} for row, k_used in zip(ROWS, used, strict=True)]
    lines = format_two_stage({"rows": rows, "model": {}, "backend": "exact"}).splitlines()
    assert [line.split(" | ")[1] for line in lines[2:6]] == ["all", "16", "64 / 24", "120 / 24"]
    assert lines[8] == (
        "k is the shortlist length used, clipped to the candidates each direction ranks (i2t / t2i where "
        "they differ): k = 64, 128 were asked for."
    )
    # recorded and computed agree: the table of a new result reads as the one of an old result
    with_counts = format_two_stage({"rows": rows, "model": MODEL, "backend": "faiss_ivf"})
    assert with_counts == format_two_stage({"rows": ROWS, "model": MODEL, "backend": "faiss_ivf"})
