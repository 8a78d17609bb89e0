"""The evaluation's GPU paths wait for the device a number of times set by their shapes, not once per image or
per length: counted on the simulated accelerator (:mod:`patchword.testing.simulated_device`).

* The default ``ScoringEngine.score_pairs`` (SCAN, NAAF, VSE, FILIP, CLIP, and the forward engine of any
  matcher: two-stage evaluation, the compositional suite, ``bench two-stage``) called the engine once per
  image: one wait per image for its row (host inputs), 5.2 per image with device inputs (blocking index
  uploads, the lengths copied back, the row read), and the captions uploaded again for every image (3.6x the
  inputs' bytes). It now stages the job once and gathers the listed pairs on the device: a fixed number of
  waits, the inputs uploaded once.
* ``encode_text_tokens`` (every evaluation's texts) and ``evaluate_selection`` uploaded lengths the host
  knows, which the text encoder and the matcher then read back from the device (two waits each, per batch).
"""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from matcher_support import seeded_matcher
from patchword.data.pipeline import ArrayImages, encode_split
from patchword.data.synthetic import SyntheticConfig, generate_split, split_object_patches
from patchword.data.tokenizers import WordVocab
from patchword.eval.engine import ForwardEngine, engine_for
from patchword.eval.engine.core import prepare_inputs
from patchword.eval.scoring import encode_text_tokens
from patchword.eval.selection import evaluate_selection
from patchword.matching import build_matcher
from patchword.testing.simulated_device import SimulatedDevice

pytestmark = pytest.mark.usefixtures("one_thread")

DIM, N_IMG, N_TXT, N_PAIRS = 16, 24, 120, 480
BUDGET = 64 << 20
_I64 = 8


def _simulated(module) -> SimulatedDevice:
    sim = SimulatedDevice()
    with sim:
        sim.to_device(module)
    return sim


def _pairs(seed: int = 0, n_img: int = N_IMG, n_txt: int = N_TXT) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_img, (N_PAIRS,), generator=g), torch.randint(0, n_txt, (N_PAIRS,), generator=g)


@pytest.mark.parametrize("on_device", [False, True], ids=["host-inputs", "device-inputs"])
@pytest.mark.parametrize("name", ["scan", "naaf", "vse", "filip", "clip"])
def test_default_score_pairs_waits_a_fixed_number_of_times_and_uploads_the_inputs_once(name, on_device):
    torch.manual_seed(1)
    m = build_matcher(name, embed_dim=DIM).eval()
    g = torch.Generator().manual_seed(0)
    img = torch.randn(N_IMG, 8 if name in ("scan", "naaf") else 9, DIM, generator=g)
    caps = torch.randn(N_TXT, 9, DIM, generator=g)
    lens = torch.randint(3, 10, (N_TXT,), generator=g)
    pairs_img, pairs_txt = _pairs()
    with torch.no_grad():
        want = m(img, caps, lens).sims[pairs_img, pairs_txt]  # the per-pair forward
    sim = _simulated(m)
    with sim:
        place = sim.to_device if on_device else (lambda t: t)
        inputs = prepare_inputs(m, place(img), place(caps), place(lens), None, None, None)
        index = (place(pairs_img), place(pairs_txt))
        sim.reset()
        got = engine_for(m).score_pairs(inputs, *index, budget=BUDGET, device=sim.device)
    assert got.device.type == "cpu" and (got - want).abs().max().item() <= 1e-5
    counts = sim.counts
    # waits: the finiteness check and the result back (before: one per image, 24 / 126 here); device inputs
    # add the lengths and the pair lists read on the host once
    assert counts.syncs <= (4 if on_device else 2), counts.sync_sites
    assert counts.d2h_copies <= (3 if on_device else 1)
    # uploads: the inputs (when on the host) once, and the plan's index tensors (image list, each block's
    # texts, a cell and a position per pair): before, 3.6x the inputs from the host
    inputs_bytes = img.numel() * 4 + caps.numel() * 4 + lens.numel() * _I64
    plan_bytes = _I64 * (N_IMG + 3 * N_PAIRS)
    assert counts.h2d_bytes <= (0 if on_device else inputs_bytes) + plan_bytes


# (variant, dense pairing, dense text given per caption): the dense rows follow images or texts
DENSE = [("code", "image", False), ("paper", "image", False), ("code", "caption", True)]


@pytest.mark.parametrize(("variant", "pairing", "per_caption"), DENSE)
def test_the_forward_engines_pairs_of_a_dense_matcher_on_the_device_equal_the_forward(
    variant, pairing, per_caption
):
    """The forward engine's ``score_pairs`` is the default: its blocks take each image's dense text
    (image-tied) or each caption's (``dense_index``), on the device, as the whole forward does."""
    m = seeded_matcher("seps", (16, True, 0.5, 0.4), DIM, variant=variant, dense_pairing=pairing)
    g = torch.Generator().manual_seed(0)
    n_img, n_txt = 8, 30
    img, caps = torch.randn(n_img, 17, DIM, generator=g), torch.randn(n_txt, 9, DIM, generator=g)
    lens = torch.randint(3, 10, (n_txt,), generator=g)
    n_dense = n_txt if per_caption else n_img
    dense, dense_lens = (
        torch.randn(n_dense, 12, DIM, generator=g),
        torch.randint(4, 13, (n_dense,), generator=g),
    )
    txt2img = torch.arange(n_txt) % n_img
    pairs_img, pairs_txt = _pairs(1, n_img, n_txt)
    with torch.no_grad():
        rows = (
            torch.arange(n_txt) if per_caption else (txt2img if pairing == "caption" else torch.arange(n_img))
        )
        full = m(img, caps, lens, dense[rows], dense_lens[rows]).sims
    sim = _simulated(m)
    with sim:
        on = [sim.to_device(t) for t in (img, caps, lens, dense, dense_lens)]
        dense_index = torch.arange(n_txt) if per_caption else (txt2img if pairing == "caption" else None)
        inputs = prepare_inputs(m, *on, dense_index)
        index = (sim.to_device(pairs_img), sim.to_device(pairs_txt))
        sim.reset()
        got = ForwardEngine(m).score_pairs(inputs, *index, budget=BUDGET, device=sim.device)
    assert (got - full[pairs_img, pairs_txt]).abs().max().item() <= 1e-5
    assert sim.counts.syncs <= 5, sim.counts.sync_sites  # + the dense lengths read on the host once


def test_pair_blocks_score_only_listed_pairs_on_the_cpu_and_few_more_on_an_accelerator():
    from patchword.eval.engine.staging import pair_blocks  # here: the other tests run without it

    img, caps = torch.zeros(N_IMG, 9, DIM), torch.zeros(N_TXT, 9, DIM)
    inputs = prepare_inputs(
        build_matcher("vse", embed_dim=DIM), img, caps, torch.full((N_TXT,), 9), None, None, None
    )
    pairs_img, pairs_txt = _pairs()
    distinct = {(int(v), int(t)) for v, t in zip(pairs_img, pairs_txt, strict=True)}
    for accelerator in (False, True):
        plan = pair_blocks(inputs, pairs_img, pairs_txt, BUDGET, accelerator)
        cells = 0
        for (i0, i1), (t0, t1), (p0, p1) in plan.blocks:
            block = (i1 - i0) * (t1 - t0)
            cells += block
            assert block <= 4 * (p1 - p0) or (accelerator and block <= 4096)
            # every listed pair of the block is its cell of the block's matrix
            for c, p in zip(plan.cells[p0:p1].tolist(), plan.pairs[p0:p1].tolist(), strict=True):
                image, text = plan.images[i0 + c // (t1 - t0)], plan.texts[t0 + c % (t1 - t0)]
                assert (int(image), int(text)) == (int(pairs_img[p]), int(pairs_txt[p]))
        assert sorted(plan.pairs.tolist()) == list(range(N_PAIRS))
        if accelerator:  # launch-bound blocks: far fewer than one per image
            assert len(plan.blocks) < N_IMG // 4
        else:  # no pair scored that is not listed (as one image at a time)
            assert cells == len(distinct)
    # a budget too small for two images: one image per block
    one = pair_blocks(inputs, pairs_img, pairs_txt, 4 * (9 * DIM * 4 * 2), True)
    assert all(i1 - i0 == 1 for (i0, i1), _, _ in one.blocks)


def _texts(n: int = 600, width: int = 20):
    g = torch.Generator().manual_seed(0)
    return torch.randint(5, 40, (n, width), generator=g), torch.randint(3, width + 1, (n,), generator=g)


def test_encoding_texts_reads_no_length_back_from_the_device():
    model = tiny_model([f"w{i}" for i in range(40)])
    ids, lens = _texts()
    want = encode_text_tokens(model, ids, lens, batch_size=256)
    sim = _simulated(model)
    with sim:
        sim.reset()
        got = encode_text_tokens(model, ids, lens, batch_size=256, device=sim.device)
    batches = 3
    # per batch: the tokens back, nothing else (before: 5, the lengths uploaded, read back twice by the
    # encoder's check, the ids' blocking upload and the encoder's own blocking upload of the lengths)
    assert sim.counts.syncs <= batches, sim.counts.sync_sites
    assert (got - want).abs().max().item() <= 1e-5


SELECTION = SyntheticConfig(seed=2, image_size=32, num_train=2, num_dev=2, num_test=20)


@pytest.mark.parametrize(
    "model_args",
    [dict(matcher="seps", variant="paper"), dict(matcher="seps", variant="code", dense_pairing="caption")],
)
def test_selection_quality_reads_no_length_back_from_the_device(model_args):
    split = generate_split(SELECTION, "test")
    vocab = WordVocab.build(split.captions + split.dense_captions)
    images = ArrayImages(split.images)
    encoded = encode_split(
        split.to_retrieval_split(), vocab, images, max_caption_len=40, max_dense_len=160, use_dense=True
    )
    masks = split_object_patches(split.scenes, SELECTION, "test", grid=4).any(1)
    model = tiny_model(vocab, **model_args)
    want = evaluate_selection(model, encoded, masks, image_block=5)
    sim = _simulated(model)
    with sim:
        sim.reset()
        got = evaluate_selection(model, encoded, masks, image_block=5, device=sim.device)
    assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k]) for k in want)
    blocks, branches = 4, 2
    # per block: the matcher's finiteness check of its three token tensors, one copy back per branch
    # (before: 20, the lengths uploaded and read back by the encoder and the matcher)
    assert sim.counts.syncs <= blocks * (3 + branches), sim.counts.sync_sites
