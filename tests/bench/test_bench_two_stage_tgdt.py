"""``bench two-stage`` on a TGDT hybrid run: its shortlists are re-scored by the plan's fine (local) matcher,
so that the ``alpha`` row weighs the global score once. f715cbc..1c0f772 re-scored with the hybrid matcher
itself, whose score already adds ``hybrid_alpha * s_g``: the alpha row counted the global score twice."""

from __future__ import annotations

import pytest

from conftest import TINY_REGIONS, TINY_TGDT
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_alpha_row_of_a_tgdt_run_is_its_hybrid_search(tmp_path, monkeypatch):
    import patchword.eval as eval_api
    from patchword.bench.two_stage import run_two_stage

    args = ["train", *TINY_REGIONS, *TINY_TGDT, "train.max_steps=2", f"output_dir={tmp_path}", "name=tgdt"]
    assert main(args) == 0
    fine = []  # the matcher each two-stage call re-scored with, and its alpha
    two_stage_scores = eval_api.two_stage_scores

    def noting(matcher, *rest, **kwargs):
        fine.append((matcher.config.inference, kwargs["alpha"]))
        return two_stage_scores(matcher, *rest, **kwargs)

    monkeypatch.setattr(eval_api, "two_stage_scores", noting)
    # shortlists as long as the gallery: the alpha = 1 (= hybrid_alpha) row is the exhaustive hybrid ranking
    out = run_two_stage(tmp_path / "tgdt", ks=(1000,), alpha=1.0, alpha_k=1000, repeats=1)
    assert {inference for inference, _ in fine} == {"local"}
    exhaustive, local, hybrid = out["rows"]
    assert (local["alpha"], hybrid["alpha"]) == (0.0, 1.0)
    assert hybrid["rsum_delta"] == 0.0
    assert all(hybrid[key] == exhaustive[key] for key in ("i2t_r1", "t2i_r1", "rsum"))
