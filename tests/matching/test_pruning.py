"""Index-time patch pruning (``index build --keep-patches``): the engine scores pruned images exactly as
the matcher's own forward does, keeping every patch changes nothing, the index records what it pruned, and
an interrupted pruned build resumes to the same bytes."""

from __future__ import annotations

import filecmp
import math

import numpy as np
import pytest
import torch

from matcher_support import ENGINE_SHAPES as SHAPES
from matcher_support import engine_inputs as _inputs
from matcher_support import engine_matcher as _matcher
from patchword.cli.search import main_index
from patchword.errors import ConfigError
from patchword.eval.engine.core import prepare_inputs
from patchword.eval.engine.seps import SEPSEngine
from patchword.matching.ops import l2norm
from patchword.search.index import build_index
from patchword.search.manifest import Manifest
from patchword.search.pruning import kept_patches, prune_patches
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from patchword.testing.seps_independent import SEPSOptions, independent_seps_scores
from search_support import caption_queries, killed_after_shards

# Patches kept per image in the engine tests: between K (ViT 98, Swin 40) and N (196, 49).
KEEP = {"vit": 130, "swin": 45}


def _scores(m, tokens, caps, lens, dense, prior, formulation="auto"):
    out = torch.empty(tokens.shape[0], caps.shape[0])
    inputs = prepare_inputs(m, tokens, caps, lens, *dense, None, patch_prior=prior)
    SEPSEngine(m, formulation).score(inputs, out, budget=1 << 28, device="cpu", progress=False)
    return out, inputs


@pytest.mark.parametrize("kind", ["vit", "swin"])
@pytest.mark.parametrize("variant", ["code", "paper"])
@pytest.mark.parametrize("dense", [False, True])
def test_a_prior_on_every_patch_gives_the_unpruned_scores(kind, variant, dense):
    """Pruning that keeps every patch is no approximation: the precomputed image part of the selection
    score plus the text part is the matcher's own score, in the engine and in the matcher's forward."""
    m = _matcher(kind, variant, dense_pairing="image")
    img, caps, lens, d, dl, _ = _inputs(kind)
    args = (d, dl) if dense else (None, None)
    n = m.config.num_patches
    pruned = prune_patches(SEPSEngine(m), img, n, device="cpu")
    assert torch.equal(pruned.tokens, img) and torch.equal(pruned.patch_ids[0].long(), torch.arange(n))
    with torch.no_grad():
        want = m(img, caps, lens, *args).sims
        forward = m(pruned.tokens, caps, lens, *args, patch_prior=pruned.prior).sims
    got, _ = _scores(m, pruned.tokens, caps, lens, args, pruned.prior)
    assert (forward - want).abs().max() <= 1e-5
    assert (got - want).abs().max() <= 1e-5


@pytest.mark.parametrize("kind", ["vit", "swin"])
@pytest.mark.parametrize("variant", ["code", "paper"])
@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("formulation", ["gram", "direct", "kdirect"])
def test_the_engine_and_forward_score_pruned_images_as_the_independent_reference(
    kind, variant, dense, formulation
):
    """Ground truth: ``patchword.testing.seps_independent`` (official options written out, raw weights),
    never the library's own forward."""
    m = _matcher(kind, variant, dense_pairing="image")
    img, caps, lens, d, dl, _ = _inputs(kind)
    args = (d, dl) if dense else (None, None)
    pruned = prune_patches(SEPSEngine(m), img, KEEP[kind], device="cpu")
    assert pruned.tokens.shape == (img.shape[0], KEEP[kind] + int(m.config.has_cls), img.shape[2])
    n, _, rho, aggr = SHAPES[kind]
    opt = SEPSOptions(sparse_ratio=rho, aggr_ratio=aggr, num_patches=n, variant=variant)
    want = independent_seps_scores(
        opt, m.state_dict(), pruned.tokens, caps, lens, *args, dense_pairing="image", patch_prior=pruned.prior
    )
    with torch.no_grad():
        forward = m(pruned.tokens, caps, lens, *args, patch_prior=pruned.prior).sims
        unpruned = m(img, caps, lens, *args).sims
    got, inputs = _scores(m, pruned.tokens, caps, lens, args, pruned.prior, formulation)
    assert (got - want).abs().max() <= 1e-5
    assert (forward - want).abs().max() <= 1e-5
    assert (unpruned - want).abs().max() > 1e-3  # an approximation: the pruned patches are missed
    pairs = SEPSEngine(m).score_pairs(
        inputs, torch.tensor([0, 3, 4]), torch.tensor([1, 1, 7]), budget=1 << 28, device="cpu"
    )
    torch.testing.assert_close(pairs, want[[0, 3, 4], [1, 1, 7]], atol=1e-5, rtol=0)


def test_pruning_keeps_the_patches_of_highest_saliency_with_their_positions_and_priors():
    """Code variant: the image part of the selection score is s_im, the cosine with the mean patch
    (computed here by hand on all patches); the kept patches are its top M, CLS stays first."""
    m = _matcher("vit", "code")
    img, *_ = _inputs("vit", n_img=3)
    patches = img[:, 1:]
    saliency = torch.einsum("vnc,vc->vn", l2norm(patches), l2norm(patches.mean(dim=1)))
    pruned = prune_patches(SEPSEngine(m), img, 120, device="cpu")
    for v in range(3):
        want = torch.sort(saliency[v].topk(120).indices).values
        assert torch.equal(pruned.patch_ids[v].long(), want)
        assert torch.equal(pruned.tokens[v, 0], img[v, 0])
        assert torch.equal(pruned.tokens[v, 1:], patches[v, want])
        torch.testing.assert_close(pruned.prior[v], saliency[v, want], atol=1e-6, rtol=0)
    assert pruned.patch_ids.dtype == torch.int16 and pruned.prior.dtype == torch.float32


def test_a_pruning_that_leaves_no_fusion_patch_or_a_matcher_without_selection_is_refused():
    from patchword.eval.engine.core import engine_for
    from patchword.matching import build_matcher

    engine = SEPSEngine(_matcher("vit", "code"))  # N = 196, K = 98
    assert kept_patches(engine, 0.75) == 147 and kept_patches(engine, 1) == 196
    for bad in (0.5, 0.2, 0, 1.5):
        with pytest.raises(ConfigError) as err:
            kept_patches(engine, bad)
        assert err.value.key == "--keep-patches"
    scan = build_matcher("scan", embed_dim=32)
    with pytest.raises(ConfigError, match="cannot score images pruned"):
        kept_patches(engine_for(scan), 0.75)
    m = _matcher("vit", "code")
    img, caps, lens, *_ = _inputs("vit")
    with pytest.raises(ValueError, match="needs more than K"):
        m(img[:, :90], caps, lens, patch_prior=torch.zeros(img.shape[0], 89))
    with pytest.raises(ValueError, match="cannot score images pruned"):
        prepare_inputs(
            scan, img[:, :, :32], caps[:, :, :32], lens, None, None, None, patch_prior=img[:, :, 0]
        )


def test_a_pruned_index_records_what_it_pruned_and_searches_the_kept_patches(env, tmp_path, one_thread):
    images, dense = env.export.files["images"], env.export.files["dense"]
    build_index(env.run, images, tmp_path / "full", dense=dense, shard_size=10)
    build_index(env.run, images, tmp_path / "pruned", dense=dense, shard_size=10, keep_patches=0.75)
    full, pruned = SearchIndex.open(tmp_path / "full"), SearchIndex.open(tmp_path / "pruned")
    n = full.manifest.model["num_patches"]
    m = math.ceil(0.75 * n)
    assert pruned.manifest.pruning["kept"] == m and pruned.manifest.pruning["of"] == n
    assert pruned.manifest.pruning["exact"] is False and full.manifest.pruning is None
    assert pruned.bytes_per_image() < full.bytes_per_image()
    ids = np.arange(len(full))
    # the stored rows are exactly the pruning of the full index's tokens
    engine = SEPSEngine(env.run.model.matcher)
    want = prune_patches(engine, full.image_tokens(ids), m, device="cpu")
    torch.testing.assert_close(pruned.image_tokens(ids), want.tokens, atol=1e-6, rtol=0)
    assert torch.equal(pruned.patch_ids(ids), want.patch_ids.long())
    torch.testing.assert_close(pruned.patch_priors(ids), want.prior, atol=1e-6, rtol=0)
    assert full.patch_priors(ids) is None
    # a search re-ranks with the matcher's forward on the kept patches
    searcher = Searcher(pruned, env.run)
    captions, _ = caption_queries(env)
    query = searcher.encode_query(captions[0])
    shortlist = torch.arange(len(pruned))
    d_tokens, d_lens = pruned.dense_tokens(shortlist)
    with torch.no_grad():
        reference = env.run.model.matcher(
            want.tokens, query.tokens, query.lens, d_tokens, d_lens, patch_prior=want.prior
        ).sims[:, 0]
    torch.testing.assert_close(searcher.rerank(query, shortlist), reference, atol=1e-5, rtol=0)
    hits = searcher.search(captions[0], k=5).hits
    assert len(hits) == 5 and all(h.path for h in hits)
    # the explanation is the pruned image's, on the whole grid: pruned patches never kept, no heat
    explanation = searcher.explain(captions[0], hits[0].id)
    kept_ids = pruned.patch_ids(torch.tensor([hits[0].id]))[0]
    gone = torch.ones(n, dtype=torch.bool)
    gone[kept_ids] = False
    for branch in explanation.branches:
        assert branch.kept.numel() == n and not branch.kept[gone].any()
        assert branch.kept_count == env.run.model.matcher.config.num_keep
    assert all(w.heat.numel() == n and not w.heat[gone].any() for w in explanation.words)
    # an existing index keeps its pruning
    with pytest.raises(ConfigError) as err:
        build_index(env.run, images, tmp_path / "pruned", dense=dense, keep_patches=0.625, update=True)
    assert err.value.key == "--keep-patches"
    with pytest.raises(ConfigError, match="keeps every patch"):
        build_index(env.run, images, tmp_path / "full", dense=dense, keep_patches=0.75, update=True)


def test_an_interrupted_pruned_build_resumes_to_the_same_index(env, tmp_path, monkeypatch, one_thread):
    images, dense = env.export.files["images"], env.export.files["dense"]
    options = dict(dense=dense, shard_size=5, batch_size=4, keep_patches=0.75)
    build_index(env.run, images, tmp_path / "whole", **options)
    with killed_after_shards(monkeypatch, 2), pytest.raises(KeyboardInterrupt):  # in the third shard
        build_index(env.run, images, tmp_path / "cut", **options)
    report = build_index(env.run, images, tmp_path / "cut", dense=dense, shard_size=5, batch_size=4)
    assert report.resumed and report.kept == 10  # resumed without the flag: the manifest keeps it
    assert Manifest.read(tmp_path / "cut") == Manifest.read(tmp_path / "whole")
    names = sorted(p.name for p in (tmp_path / "whole" / "shards").iterdir())
    assert any(name.endswith(".patch_prior.npy") for name in names)
    assert names == sorted(p.name for p in (tmp_path / "cut" / "shards").iterdir())
    for name in names:
        assert filecmp.cmp(tmp_path / "whole" / "shards" / name, tmp_path / "cut" / "shards" / name), name


def test_keep_patches_errors_are_one_line_naming_the_flag(env, tmp_path, capsys):
    images = str(env.export.files["images"])
    argv = ["build", str(env.run_dir), "--images", images, "--out", str(tmp_path / "idx")]
    assert main_index([*argv, "--keep-patches", "0.25"]) == 2  # K = N / 2: nothing left to fuse
    err = capsys.readouterr().err
    assert "--keep-patches" in err and "Traceback" not in err and not (tmp_path / "idx").exists()
    assert main_index([*argv, "--keep-patches", "0.75", "--qdrant", str(tmp_path / "q")]) == 2
    assert "--keep-patches" in capsys.readouterr().err and not (tmp_path / "idx").exists()
    assert main_index([*argv, "--keep-patches", "0.75"]) == 0
    assert "patches pruned: 12 of 16 kept per image" in capsys.readouterr().out
