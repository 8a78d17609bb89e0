"""``bench two-stage`` on a TGDT hybrid run: its shortlists are re-scored by the plan's fine (local) matcher,
so that the ``alpha`` row weighs the global score once. f715cbc..1c0f772 re-scored with the hybrid matcher
itself, whose score already adds ``hybrid_alpha * s_g``: the alpha row counted the global score twice.

Each two-stage row is compared with the exhaustive ranking of the score it ranks: 2e0a019 labelled the
exhaustive row alpha 0 while it ranked the hybrid score, and compared the alpha-0 (local) rows with it, so a
shortlist holding every candidate reported a loss (or gain) that only the change of score made."""

from __future__ import annotations

import pytest

from conftest import TINY_REGIONS, TINY_TGDT
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

HYBRID_ALPHA = 100.0  # the global score dominates: the hybrid ranking is not the local one here


@pytest.fixture(scope="module")
def tgdt_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    overrides = [*TINY_REGIONS, *TINY_TGDT, f"model.tgdt.hybrid_alpha={HYBRID_ALPHA}"]
    assert main(["train", *overrides, "train.max_steps=2", f"output_dir={runs}", "name=tgdt"]) == 0
    return runs / "tgdt"


def test_the_alpha_row_of_a_tgdt_run_is_its_hybrid_search(tgdt_run, monkeypatch):
    import patchword.eval as eval_api
    from patchword.bench.two_stage import run_two_stage

    fine = []  # the matcher each two-stage call re-scored with, and its alpha
    two_stage_scores = eval_api.two_stage_scores

    def noting(matcher, *rest, **kwargs):
        fine.append((matcher.config.inference, kwargs["alpha"]))
        return two_stage_scores(matcher, *rest, **kwargs)

    monkeypatch.setattr(eval_api, "two_stage_scores", noting)
    # shortlists as long as the gallery: the alpha = hybrid_alpha row is the exhaustive hybrid ranking
    out = run_two_stage(tgdt_run, ks=(1000,), alpha=HYBRID_ALPHA, alpha_k=1000, repeats=1)
    assert {inference for inference, _ in fine} == {"local"}
    hybrid_all, local_all, local, hybrid = out["rows"]
    assert (local["alpha"], hybrid["alpha"]) == (0.0, HYBRID_ALPHA)
    assert hybrid["rsum_delta"] == 0.0 and hybrid["baseline_alpha"] == HYBRID_ALPHA
    assert all(hybrid[key] == hybrid_all[key] for key in ("i2t_r1", "t2i_r1", "rsum"))


def test_every_row_with_every_candidate_loses_nothing(tgdt_run):
    """k >= N: every two-stage row ranks exactly what an exhaustive pass of its own score ranks."""
    from patchword.bench.two_stage import run_two_stage

    out = run_two_stage(tgdt_run, ks=(4, 1000), alpha=HYBRID_ALPHA, alpha_k=1000, repeats=1)
    exhaustive = [row for row in out["rows"] if row["method"] == "exhaustive"]
    # the model's own score (hybrid: labelled with the alpha it ranks), then its fine matcher's
    assert [row["alpha"] for row in exhaustive] == [HYBRID_ALPHA, 0.0]
    assert exhaustive[0]["rsum"] != exhaustive[1]["rsum"]  # the two scores rank differently here
    everything = [row for row in out["rows"] if row["method"] == "two-stage" and row["k"] == 1000]
    assert [row["alpha"] for row in everything] == [0.0, HYBRID_ALPHA]
    for row in everything:
        assert row["rsum_delta"] == 0.0 and row["baseline_alpha"] == row["alpha"]
    short = next(row for row in out["rows"] if row["k"] == 4)
    assert short["rsum_delta"] == short["rsum"] - exhaustive[1]["rsum"]
