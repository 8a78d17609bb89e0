"""Every GPU-facing path runs on an accelerator, checked on the CPU with the simulated device
(:mod:`patchword.testing.simulated_device`): no op mixes host and device tensors (CUDA refuses them), the
results equal the CPU's, and the block loops do not make the host wait for the device once per block.

Inputs are given both on the host and already on the device (``on_device``): with caption-tied dense text
and device inputs, f715cbc crashed in ``SEPSEngine._dense_columns`` (indices on the device, the indexed
tensor on the host), in the dense pass and in ``score_pairs``.
"""

from __future__ import annotations

import math

import pytest
import torch

from matcher_support import seeded_matcher
from patchword.eval import score_matrix
from patchword.eval.engine import SEPSEngine, engine_for
from patchword.eval.engine import seps_plan as seps_engine
from patchword.eval.engine.core import prepare_inputs
from patchword.matching import build_matcher
from patchword.search.pruning import prune_patches
from patchword.testing.simulated_device import SimulatedDevice

pytestmark = pytest.mark.usefixtures("one_thread")

DIM = 32
SHAPES = {"vit": (36, True, 0.5, 0.4), "swin": (16, False, 0.8, 0.6)}


def _matcher(name="seps", variant="code", pairing="image", kind="vit", **kw):
    return seeded_matcher(name, SHAPES[kind], DIM, variant=variant, dense_pairing=pairing, **kw)


def _inputs(kind="vit", n_img=6, n_txt=30, n_dense=None, seed=0):
    n, has_cls, *_ = SHAPES[kind]
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(n_img, n + int(has_cls), DIM, generator=g)
    caps = torch.randn(n_txt, 12, DIM, generator=g)
    lens = torch.randint(3, 13, (n_txt,), generator=g)
    n_dense = n_img if n_dense is None else n_dense
    dense = torch.randn(n_dense, 25, DIM, generator=g)
    dense_lens = torch.randint(5, 26, (n_dense,), generator=g)
    txt2img = torch.arange(n_txt) % n_img
    return img, caps, lens, dense, dense_lens, txt2img


def _on(sim, tensors, on_device: bool):
    """The tensors on the simulated device (when ``on_device``) or as they are (host)."""
    return [t if t is None or not on_device else sim.to_device(t) for t in tensors]


def _simulated(matcher) -> SimulatedDevice:
    sim = SimulatedDevice()
    with sim:
        sim.to_device(matcher)
    return sim


# (variant, pairing, dense given, txt2img given): every mode of the SEPS engine
MODES = [
    ("code", "image", False, False),
    ("code", "image", True, False),
    ("code", "caption", True, True),
    ("code", "caption", True, False),
    ("paper", "image", True, False),
    ("paper", "caption", True, True),
]


@pytest.mark.parametrize("blocks", ["one", "many"])
@pytest.mark.parametrize("on_device", [False, True], ids=["host-inputs", "device-inputs"])
@pytest.mark.parametrize(("variant", "pairing", "dense", "t2i"), MODES)
@pytest.mark.parametrize("name", ["seps", "laps"])
def test_score_matrix_on_the_device_equals_the_cpu(
    name, variant, pairing, dense, t2i, on_device, blocks, monkeypatch
):
    if blocks == "many":  # accelerator blocks of 2 images x 8 captions (buckets of 4): rows assembled
        monkeypatch.setattr(seps_engine, "_ACCEL_IMAGES", 2)
        monkeypatch.setattr(seps_engine, "_ACCEL_TEXTS", 8)
        monkeypatch.setattr(seps_engine, "_ACCEL_DENSE_TEXTS", 4)
        monkeypatch.setattr(seps_engine, "_ACCEL_BUCKET", 4)
    m = _matcher(name, variant, pairing)
    img, caps, lens, d, dl, txt2img = _inputs(n_dense=None if (pairing == "image" or t2i) else 30)
    args = (d, dl) if dense else (None, None)
    kwargs = {"txt2img": txt2img if t2i else None}
    want = score_matrix(m, img, caps, lens, *args, **kwargs, engine="forward")
    cpu = score_matrix(m, img, caps, lens, *args, **kwargs)
    sim = _simulated(m)
    with sim:
        inputs = _on(sim, [img, caps, lens, *args], on_device)
        sim.reset()
        engine = engine_for(m)
        got = score_matrix(m, *inputs, **kwargs, device=sim.device, max_memory_mb=64, engine=engine)
    assert got.device.type == "cpu" and got.dtype == torch.float32
    assert (got - want).abs().max().item() <= 1e-5
    assert (got - cpu).abs().max().item() <= 1e-5
    plan = engine.last_plan
    image_blocks = math.ceil(img.shape[0] / plan.image_block)
    if blocks == "many":  # the plan really cut the job
        assert image_blocks > 1 and plan.details["text_blocks"] > 1, (plan.image_block, plan.text_block)
    # at most: the stability flags and the rows of each image block, plus, when lengths and pairing were
    # given on the device, their validation (max and min of each) and one host copy of each before the loop
    assert sim.counts.syncs <= 2 * image_blocks + (9 if on_device else 0), sim.counts.sync_sites
    # inputs go up once: no more bytes than the inputs and the small index tensors
    given = sum(t.numel() * t.element_size() for t in (img, caps, *args) if t is not None)
    assert sim.counts.h2d_bytes <= (0 if on_device else given) + 64 * 1024


@pytest.mark.parametrize("on_device", [False, True], ids=["host-inputs", "device-inputs"])
@pytest.mark.parametrize(("variant", "pairing", "dense", "t2i"), MODES)
def test_score_pairs_on_the_device_equals_the_cpu(variant, pairing, dense, t2i, on_device):
    m = _matcher("seps", variant, pairing)
    img, caps, lens, d, dl, txt2img = _inputs(n_dense=None if (pairing == "image" or t2i) else 30)
    args = (d, dl) if dense else (None, None)
    full = score_matrix(m, img, caps, lens, *args, txt2img=txt2img if t2i else None, engine="forward")
    g = torch.Generator().manual_seed(3)
    pairs_img = torch.randint(0, img.shape[0], (40,), generator=g)
    pairs_txt = torch.randint(0, caps.shape[0], (40,), generator=g)
    engine = engine_for(m)
    sim = _simulated(m)
    with sim:
        inputs = prepare_inputs(m, *_on(sim, [img, caps, lens, *args], on_device), txt2img if t2i else None)
        index = _on(sim, [pairs_img, pairs_txt], on_device)
        got = engine.score_pairs(inputs, *index, budget=64 << 20, device=sim.device)
    assert got.device.type == "cpu"
    assert (got - full[pairs_img, pairs_txt]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("variant", ["code", "paper"])
def test_pruned_images_score_on_the_device_as_on_the_cpu(variant):
    m = _matcher("seps", variant, "image")
    img, caps, lens, d, dl, _ = _inputs()
    pruned = prune_patches(SEPSEngine(m), img, 24, device="cpu")
    cpu_inputs = prepare_inputs(m, pruned.tokens, caps, lens, d, dl, None, patch_prior=pruned.prior)
    want = torch.empty(img.shape[0], caps.shape[0])
    SEPSEngine(m).score(cpu_inputs, want, budget=64 << 20, device=torch.device("cpu"), progress=False)
    want_priors = SEPSEngine(m).patch_priors(img, device="cpu")
    sim = _simulated(m)
    with sim:
        tokens, prior, c, cl, dd, ddl = _on(sim, [pruned.tokens, pruned.prior, caps, lens, d, dl], True)
        inputs = prepare_inputs(m, tokens, c, cl, dd, ddl, None, patch_prior=prior)
        got = torch.empty_like(want)
        SEPSEngine(m).score(inputs, got, budget=64 << 20, device=sim.device, progress=False)
        # the priors themselves, computed on the device
        priors = SEPSEngine(m).patch_priors(sim.to_device(img), device=sim.device)
    assert (got - want).abs().max().item() <= 1e-5
    assert priors.device.type == "cpu"
    assert (priors - want_priors).abs().max().item() <= 1e-6


def test_image_constants_on_the_device_equal_the_cpu():
    m = _matcher("seps", "code", "image")
    img, caps, lens, d, dl, _ = _inputs(n_img=20)
    want = SEPSEngine(m).image_constants(img, d, dl, device="cpu")
    sim = _simulated(m)
    with sim:
        got = SEPSEngine(m).image_constants(*_on(sim, [img, d, dl], True), device=sim.device)
    assert got.device.type == "cpu"
    assert (got - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", ["scan", "vse", "filip"])
def test_other_engines_and_the_forward_fallback_run_on_the_device(name):
    torch.manual_seed(0)
    has_cls = name != "scan"  # SCAN's regions have no CLS token
    m = build_matcher(name, embed_dim=DIM, num_patches=36, has_cls=has_cls).eval()
    img, caps, lens, *_ = _inputs()
    img = img if has_cls else img[:, 1:]
    want = score_matrix(m, img, caps, lens, engine="forward")
    sim = _simulated(m)
    with sim:
        got = score_matrix(m, *_on(sim, [img, caps, lens], True), device=sim.device)
        forward = score_matrix(m, *_on(sim, [img, caps, lens], True), device=sim.device, engine="forward")
    assert (got - want).abs().max().item() <= 1e-5
    assert (forward - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", ["scan", "vse"])
def test_a_matcher_without_parameters_scores_where_its_inputs_are(name):
    """Old code: with no ``device=``, a matcher holding no parameter (SCAN, VSE, TGDT's fine stage) was
    taken to be on the CPU, so device inputs were copied to the host and scored there."""
    torch.manual_seed(0)
    has_cls = name != "scan"
    m = build_matcher(name, embed_dim=DIM, num_patches=36, has_cls=has_cls).eval()
    assert not list(m.parameters()) and not list(m.buffers())
    img, caps, lens, *_ = _inputs()
    img = img if has_cls else img[:, 1:]
    want = score_matrix(m, img, caps, lens)
    sim = SimulatedDevice()
    with sim:
        inputs = _on(sim, [img, caps, lens], True)
        sim.reset()
        got = score_matrix(m, *inputs)
    assert (got - want).abs().max().item() <= 1e-5
    assert sim.counts.ops > 0  # the scoring ran on the device...
    # ...and only the scores came back: no token block was copied to the host
    assert sim.counts.d2h_bytes < img.numel() * 4


def test_the_device_plan_uses_large_blocks_and_few_ops_per_pair():
    """Counted on a dry walk at ViT-B/16 shapes (196 patches, C = 512): 64 images x 2048 captions. On
    f715cbc the engine ran 1 image x ~147 captions per block and ~895 ops per image per 1000 captions
    (~0.9 ops per pair, ~117k ops here) with ~1 host sync per block; now thousands of pairs share a block."""
    from patchword.bench.inputs import build_bench_matcher

    for config in ("seps-code-image", "seps-code-caption"):
        m = build_bench_matcher(config)
        n_img, n_txt = 64, 2048
        g = torch.Generator().manual_seed(0)
        lens = torch.randint(8, 30, (n_txt,), generator=g)
        caption_tied = m.dense_pairing == "caption"
        dense_lens = torch.randint(60, 128, (n_img,), generator=g)
        txt2img = torch.arange(n_txt) % n_img if caption_tied else None
        sim = SimulatedDevice(dry=True)
        engine = engine_for(m)
        with sim:
            sim.to_device(m)
            sim.reset()
            args = (torch.empty(n_img, 197, 512), torch.empty(n_txt, 30, 512), lens)
            dense = (torch.empty(n_img, 128, 512), dense_lens)
            score_matrix(
                m, *args, *dense, txt2img=txt2img, device=sim.device, max_memory_mb=16384, engine=engine
            )
        counts, plan = sim.counts, engine.last_plan
        assert plan.image_block * plan.text_block >= 8192, (plan.image_block, plan.text_block)
        assert counts.ops / (n_img * n_txt) < 0.05, counts.ops  # f715cbc: ~0.9
        blocks = math.ceil(n_img / plan.image_block) * plan.details["text_blocks"]
        assert counts.syncs <= max(blocks, 4), counts.sync_sites
        inputs = sum(t.numel() * t.element_size() for t in (*args[:2], dense[0]))
        assert inputs <= counts.h2d_bytes <= inputs + (1 << 20)  # uploaded once


def test_searcher_reranks_on_the_device_as_on_the_cpu():
    """The two-stage search's fine stage (``Searcher.rerank``'s engine call: ``ScoringEngine.score``
    on a shortlist) with the index's tokens moved to the device."""
    m = _matcher("seps", "code", "image")
    img, caps, lens, d, dl, _ = _inputs(n_img=12, n_txt=1)
    engine = engine_for(m)
    constants = engine.image_constants(img, d, dl, device="cpu")
    want = torch.empty(12, 1)
    engine.score(
        prepare_inputs(m, img, caps, lens, None, None, None, image_constants=constants),
        want,
        budget=64 << 20,
        device=torch.device("cpu"),
        progress=False,
    )
    sim = _simulated(m)
    with sim:
        tokens, c, cl, k = _on(sim, [img, caps, lens, constants], True)
        got = torch.empty(12, 1)
        inputs = prepare_inputs(m, tokens, c, cl, None, None, None, image_constants=k)
        engine.score(inputs, got, budget=64 << 20, device=sim.device, progress=False)
    assert (got - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize(("variant", "pairing"), [("code", "image"), ("paper", "caption")])
def test_one_training_step_on_the_device_has_the_loss_and_gradients_of_the_cpu(variant, pairing):
    """ShardLoss forward + backward of a tiny SEPS model (tests/eval/test_cuda.py's step) on the simulated
    device: no op mixes devices, the step waits for the device only to upload its batch, and the loss and
    every gradient equal the CPU's."""
    from test_cuda import _tiny_step, assert_gradients_close

    loss_cpu, stats_cpu, grads_cpu = _tiny_step(variant, pairing, "cpu")
    sim = SimulatedDevice()
    with sim:
        loss, stats, grads = _tiny_step(variant, pairing, sim.device)
    assert abs(float(loss - loss_cpu)) <= 1e-5 * abs(float(loss_cpu))
    torch.testing.assert_close(stats, stats_cpu, rtol=1e-5, atol=1e-7)
    assert_gradients_close(grads, grads_cpu, 1e-5)
    # the only waits: the blocking uploads of the model and the batch, and the results read back at the end
    waits = set(sim.counts.sync_sites)
    assert all("test_cuda.py" in site or "nn/modules/module.py" in site for site in waits), waits


@pytest.mark.parametrize(("variant", "pairing"), [("code", "image"), ("paper", "caption")])
def test_two_stage_search_on_the_device_equals_the_cpu(variant, pairing):
    from patchword.eval.two_stage import two_stage_scores

    m = _matcher("seps", variant, pairing)
    img, caps, lens, d, dl, txt2img = _inputs()
    t2i = txt2img if pairing == "caption" else None
    cpu = two_stage_scores(m, img, caps, lens, d, dl, txt2img=t2i, k=(3, 2))
    sim = _simulated(m)
    with sim:
        got = two_stage_scores(
            m, *_on(sim, [img, caps, lens, d, dl], True), txt2img=t2i, k=(3, 2), device=sim.device
        )
    for want, have in zip(cpu.sims, got.sims, strict=True):
        assert have.device.type == "cpu"
        assert torch.equal(torch.isinf(want), torch.isinf(have))  # the same shortlists
        finite = torch.isfinite(want)
        assert (want[finite] - have[finite]).abs().max().item() <= 1e-5


def test_searcher_on_the_device_finds_what_it_finds_on_the_cpu(env):
    """The search Searcher with its run loaded on the simulated device: query encoding, first stage and
    re-ranking give the CPU's hits and scores."""
    from patchword.runs import load_run
    from patchword.search.query import Searcher
    from patchword.search.store import SearchIndex

    queries = ["a red circle", "a small blue square left of a green triangle"]
    cpu = Searcher(SearchIndex.open(env.index_dir), env.run)
    want = [cpu.search(q, k=5) for q in queries]
    sim = SimulatedDevice()
    with sim:
        searcher = Searcher(SearchIndex.open(env.index_dir), load_run(env.run_dir, device=sim.device))
        got = [searcher.search(q, k=5) for q in queries]
    for a, b in zip(want, got, strict=True):
        assert [h.id for h in a.hits] == [h.id for h in b.hits]
        assert max(abs(h.score - g.score) for h, g in zip(a.hits, b.hits, strict=True)) <= 1e-5


def test_evaluating_a_run_on_the_device_gives_the_cpu_metrics(env, tmp_path):
    """``patchword eval``'s evaluation (eval.runs._evaluate: encoding, the full matrix, the metrics) with
    the run on the simulated device."""
    from patchword.distributed import Distributed
    from patchword.runs import read_run_config
    from patchword.runs.evaluate import _evaluate

    saved = read_run_config(env.run_dir)
    with SimulatedDevice() as sim:
        got, _ = _evaluate(
            env.run_dir, None, [], None, tmp_path / "sim.json", True, Distributed(device=sim.device), saved
        )
    cpu = Distributed(device=torch.device("cpu"))
    want, _ = _evaluate(env.run_dir, None, [], None, tmp_path / "cpu.json", True, cpu, saved)
    keys = [k for k, v in want.items() if isinstance(v, float) and ("r1" in k or "rsum" in k)]
    assert keys
    for key in keys:
        assert got[key] == pytest.approx(want[key], abs=1e-6), key


@pytest.mark.parametrize("on_device", [False, True], ids=["host-inputs", "device-inputs"])
def test_caption_blocks_choose_their_formulation_by_their_width_on_the_device(on_device, monkeypatch):
    """An accelerator plan sorts the captions into length buckets; each caption block takes the cheaper
    formulation for its own width ("gram" for short texts), as on the CPU. f07ac7d used the longest
    caption's for every block ("direct" here). Scores equal the forward's either way."""
    monkeypatch.setattr(seps_engine, "_ACCEL_IMAGES", 2)
    monkeypatch.setattr(seps_engine, "_ACCEL_TEXTS", 8)
    monkeypatch.setattr(seps_engine, "_ACCEL_BUCKET", 4)
    dim = 256  # 16 patches, 8 tokens per pair: "gram" is cheaper below 25 words at this width
    m = seeded_matcher("seps", SHAPES["swin"], dim, variant="code")
    g = torch.Generator().manual_seed(0)
    img = torch.randn(4, 16, dim, generator=g)
    lens = torch.tensor([4, 6, 8, 10, 12, 30, 34, 40] * 2)
    caps = torch.randn(lens.numel(), 40, dim, generator=g)
    forms = []
    align = SEPSEngine._align

    def spy(self, img, ts, txt, form):
        forms.append((txt.words.shape[1], form))
        return align(self, img, ts, txt, form)

    monkeypatch.setattr(SEPSEngine, "_align", spy)
    want = score_matrix(m, img, caps, lens, engine="forward")
    sim = _simulated(m)
    with sim:
        got = score_matrix(m, *_on(sim, [img, caps, lens], on_device), device=sim.device, max_memory_mb=64)
    assert {form for width, form in forms if width <= 12} == {"gram"}
    assert {form for width, form in forms if width >= 30} == {"direct"}
    assert (got - want).abs().max().item() <= 1e-5
