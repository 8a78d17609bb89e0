"""The search's GPU paths on the simulated accelerator (:mod:`patchword.testing.simulated_device`): what
crashed there, and what waited for the device once per word, per weight or per length.

* ``index build --dense-store scores`` probed the matcher on the CPU while its weights were on the device:
  it crashed on any accelerator before writing anything.
* ``Searcher.explain`` (``/api/explain``) read three values per query word from the device.
* Every ``Searcher`` (each reopen after an index update) hashed the run's weights by copying each of them
  back from the device.
* A query's lengths, known on the host, were uploaded and then read back by the encoder and the matcher.

(Named apart from tests/eval/test_gpu_path_syncs.py: pytest imports test modules by their base name.)
"""

from __future__ import annotations

import pytest
import torch

from patchword.matching import build_matcher
from patchword.runs import load_run
from patchword.search.explain import explain_pair
from patchword.search.identity import weights_sha256
from patchword.search.query import Searcher
from patchword.search.query_encode import encode_query
from patchword.search.store import SearchIndex
from patchword.testing.simulated_device import SimulatedDevice
from search_support import caption_queries, train_code_variant

pytestmark = pytest.mark.usefixtures("one_thread")

SHORT = "a red circle"
LONG = "a small blue square left of a green triangle above a big red circle near a cyan cross"


def test_a_dense_scores_index_builds_on_the_device_as_on_the_cpu(env, tmp_path):
    from patchword.search.index import build_index

    run = train_code_variant(env, tmp_path)  # SEPS as released: one dense score per image
    images, dense = env.export.files["images"], env.export.files["dense"]
    options = dict(dense=dense, dense_store="scores", shard_size=10, batch_size=8)
    build_index(run, images, tmp_path / "cpu", **options)
    sim = SimulatedDevice()
    with sim:
        on_device = load_run(run.run_dir, device=sim.device)
        build_index(on_device, images, tmp_path / "device", device=sim.device, **options)
    want, got = SearchIndex.open(tmp_path / "cpu"), SearchIndex.open(tmp_path / "device")
    assert len(got) == len(want)
    ids = torch.arange(len(want))
    assert [got.path(i) for i in ids.tolist()] == [want.path(i) for i in ids.tolist()]
    assert (got.dense_scores(ids) - want.dense_scores(ids)).abs().max().item() <= 1e-5


def _on_device(env, sim: SimulatedDevice) -> Searcher:
    with sim:
        return Searcher(SearchIndex.open(env.index_dir), load_run(env.run_dir, device=sim.device))


def test_an_explanation_waits_for_the_device_the_same_number_of_times_for_any_query_length(env, searcher):
    sim = SimulatedDevice()
    on_device = _on_device(env, sim)
    image = searcher.search(SHORT, k=2).hits[1].id
    syncs = {}
    for text in (SHORT, LONG):
        with sim:
            sim.reset()
            got = on_device.explain(text, image)
        syncs[text] = sim.counts.syncs
        want = searcher.explain(text, image)
        assert got.score == pytest.approx(want.score, abs=1e-5)
        assert [w.best_token for w in got.words] == [w.best_token for w in want.words]
        for a, b in zip(got.words, want.words, strict=True):
            assert a.cosine == pytest.approx(b.cosine, abs=1e-5)
            assert (a.heat - b.heat).abs().max().item() <= 1e-5
        assert [b.kept.tolist() for b in got.branches] == [b.kept.tolist() for b in want.branches]
    words = len(searcher.explain(LONG, image).words)
    # the words are explained on the host, from one copy of the small tensors they read: before, 3 reads
    # per word (96 for the long query's 20 tokens, 51 for the short one's 5)
    assert syncs[LONG] == syncs[SHORT] < words, syncs


def test_a_token_cosine_explanation_waits_for_the_device_the_same_number_of_times_for_any_query_length():
    torch.manual_seed(0)
    matcher = build_matcher("vse", embed_dim=8, num_patches=4, has_cls=True).eval()
    img, cap = torch.randn(5, 8), torch.randn(12, 8)
    sim = SimulatedDevice()
    with sim:
        sim.to_device(matcher)
    syncs = []
    for n in (3, 12):
        with sim:
            tokens = sim.to_device(img), sim.to_device(cap)
            sim.reset()
            got = explain_pair(matcher, *tokens, n, grid=(2, 2))
        syncs.append(sim.counts.syncs)
        cos = (
            torch.nn.functional.normalize(img[1:], dim=-1) @ torch.nn.functional.normalize(cap[:n], dim=-1).T
        )
        for w, word in enumerate(got.words):
            torch.testing.assert_close(word.heat, cos[:, w])
            assert word.best_token == f"patch:{int(cos[:, w].argmax())}"
    # the matcher's finiteness checks of both token tensors, then one copy back (before: 3 more per word)
    assert syncs[0] == syncs[1] <= 3, syncs


def test_reopening_a_searcher_copies_no_weight_back(env):
    sim = SimulatedDevice()
    first = _on_device(env, sim)
    with sim:
        sim.reset()
        first.reopen()
    # before: every tensor of the state dict copied back to be hashed (60 copies here)
    assert (sim.counts.d2h_copies, sim.counts.syncs) == (0, 0), sim.counts.sync_sites


def test_the_weights_digest_follows_the_weights():
    """The digest is computed once per model and state: a weight written in place (an optimizer step,
    ``load_state_dict``) or a module moved is hashed again, to what the same weights hash to on the CPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    before = weights_sha256(model)
    assert weights_sha256(model) == before
    with torch.no_grad():
        model[0].weight[1, 2] += 1.0
    after = weights_sha256(model)
    twin = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    twin.load_state_dict(model.state_dict())
    assert after != before and weights_sha256(twin) == after
    sim = SimulatedDevice()
    with sim:
        sim.to_device(model)
        sim.reset()
        assert weights_sha256(model) == after  # moved: hashed again (copied back once), same bytes
        copies = sim.counts.d2h_copies
        assert weights_sha256(model) == after
    assert copies == len(model.state_dict()) and sim.counts.d2h_copies == copies
    with torch.inference_mode():  # weights without a version counter: hashed every time
        made = torch.nn.Linear(4, 3)
        first = weights_sha256(made)
        made.weight.add_(1.0)
        assert weights_sha256(made) != first


def test_a_query_reads_no_length_back_from_the_device(env, searcher):
    sim = SimulatedDevice()
    on_device = _on_device(env, sim)
    captions, _ = caption_queries(env)
    with sim:
        sim.reset()
        got = encode_query(on_device.run, captions[0])
    want = encode_query(env.run, captions[0])
    assert (got.tokens - want.tokens).abs().max().item() <= 1e-5
    assert (got.global_embedding - want.global_embedding).abs().max().item() <= 1e-5
    # the tokens and the global embedding back, the matcher's finiteness check of the tokens (before: 10,
    # the lengths uploaded twice and read back by the encoder's and the matcher's length checks, and the
    # text encoder's blocking upload of the host lengths)
    assert sim.counts.syncs <= 3, sim.counts.sync_sites
