"""The matcher contract, checked for every registered matcher (as timm's tests run over ``list_models()``):
build, forward shapes, global embeddings, the scoring engine equals forward, a state-dict round trip, and
dense-text handling as the matcher declares it. Every matcher a fresh ``import patchword`` registers (the
built-ins, an installed distribution's entry point), never a toy a test module registers for itself."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from patchword.eval import score_matrix
from patchword.eval.engine import engine_for
from patchword.matching import (
    Matcher,
    MatcherOutput,
    build_matcher,
    list_matchers,
    matcher_config_class,
    matcher_reads_dense,
)
from patchword.matching.registry import matcher_spec

DIM = 32
N_PATCHES = 16  # a 4x4 grid
BUILTIN = ["seps", "laps", "vse", "clip", "filip", "scan", "naaf", "tgdt"]


def _takes_cls(name: str) -> bool:
    """A matcher whose config has no ``has_cls`` takes tokens without a CLS token (region features)."""
    return "has_cls" in {f.name for f in dataclasses.fields(matcher_config_class(name))}


def _geometry(name: str) -> dict:
    # Region matchers take tokens without a CLS token; the others get a ViT-like CLS + 16 patches.
    return dict(embed_dim=DIM, num_patches=N_PATCHES, has_cls=_takes_cls(name))


def _build(name: str) -> Matcher:
    torch.manual_seed(0)
    return build_matcher(name, **_geometry(name)).eval()


def _inputs(matcher: Matcher, n_img: int = 3, n_txt: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(n_img, N_PATCHES + int(matcher.has_cls), DIM, generator=g)
    caps = torch.randn(n_txt, 9, DIM, generator=g)
    lens = torch.tensor([9, 5, 7, 3, 9][:n_txt])
    dense = torch.randn(n_img, 12, DIM, generator=g)
    dense_lens = torch.tensor([12, 8, 10, 6][:n_img])
    return img, caps, lens, dense, dense_lens


TESTS = Path(__file__).resolve().parents[1]


def _registered_by_a_test_module(name: str) -> bool:
    """Whether matcher ``name``'s class is defined in a file under tests/ (a plug-in test's toy)."""
    path = getattr(sys.modules.get(matcher_spec(name).cls.__module__), "__file__", None)
    return path is not None and Path(path).resolve().is_relative_to(TESTS)


#: The matchers every case below runs over. Not ``list_matchers()`` as this module is imported: the registry
#: is global, and a test module that registers a toy when imported (test_plugin_matcher.py's ``toy-dot``,
#: whose forward then mixed float dtypes) had it in these cases only when pytest imported that module first:
#: ``pytest test_plugin_matcher.py test_matcher_contract.py`` failed a case that both files alone passed.
MATCHERS = [n for n in list_matchers() if not _registered_by_a_test_module(n)]


@pytest.fixture(params=MATCHERS)
def name(request):
    return request.param


# Matchers split by what they declare, at collection, so that each case below runs its asserts (a test that
# returned early for the matchers it does not apply to would pass them without checking anything).
SELECTING = [n for n in MATCHERS if _build(n).selection_ratio is not None]
NOT_SELECTING = [n for n in MATCHERS if n not in SELECTING]
REGION = [n for n in MATCHERS if not _takes_cls(n)]


def test_the_cases_are_what_a_fresh_import_registers_whatever_else_pytest_collected():
    """The contract's matchers do not depend on which test modules pytest imported before this one."""
    fresh = subprocess.run(
        [sys.executable, "-c", "from patchword.matching import list_matchers; print(*list_matchers())"],
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard only
    )
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert fresh.stdout.split() == MATCHERS


def test_every_builtin_matcher_is_registered():
    assert set(list_matchers()) >= set(BUILTIN)


def test_contract_attributes_are_declared(name):
    m = _build(name)
    assert isinstance(m, Matcher)
    assert m.embed_dim == DIM and isinstance(m.consumes_dense, bool)
    assert m.dense_pairing in ("image", "caption")
    assert m.ratio_mode in ("sum_masks", "per_branch")
    assert m.selection_ratio is None or 0 < m.selection_ratio <= 1
    assert m.global_loss in (None, "cmc")
    assert m.leaky is (m.consumes_dense and m.dense_pairing == "caption")
    assert matcher_reads_dense(name) is m.consumes_dense
    plan = m.two_stage_plan()
    assert plan is None or isinstance(plan.fine, Matcher)
    memory = m.pair_memory_bytes(N_PATCHES, 9, 12, DIM)
    assert memory is None or memory > 0
    scale = m.temperature_scale()
    assert scale is None or scale.item() > 0


def test_the_declared_splits_cover_the_builtins():
    # Guards the collection-time lists below: each names the built-ins it must, so none is silently empty.
    assert {"seps", "laps"} <= set(SELECTING)
    assert {"vse", "clip", "filip", "scan", "naaf", "tgdt"} <= set(NOT_SELECTING)
    assert {"scan", "naaf"} <= set(REGION) and not {"seps", "laps", "vse", "clip"} & set(REGION)


@pytest.mark.parametrize("selecting", SELECTING)
def test_selection_trace_matches_the_forward_decisions(selecting):
    m = _build(selecting)
    img, caps, lens, dense, dense_lens = _inputs(m, n_img=1, n_txt=1)
    trace = m.selection_trace(img, caps, lens, dense, dense_lens)
    with torch.no_grad():
        out = m(img, caps, lens, dense if m.consumes_dense else None, dense_lens)
    assert len(trace.branches) == len(out.decisions) >= 1
    assert [b for b, _ in trace.branches] == list(m.selection_branches)[: len(trace.branches)]
    for (_, kept), decision in zip(trace.branches, out.decisions, strict=True):
        assert torch.equal(kept, decision[0, 0] > 0.5)
        # Hard top-K in eval mode: K = ceil(ratio * N) patches kept (8 of 16 at the default ratio 0.5).
        assert int(kept.sum()) == math.ceil(m.selection_ratio * N_PATCHES)
    assert trace.mixture.shape[1] == N_PATCHES and trace.patches.shape == (N_PATCHES, DIM)


@pytest.mark.parametrize("plain", NOT_SELECTING)
def test_a_matcher_that_selects_no_patches_has_no_trace(plain):
    m = _build(plain)
    img, caps, lens, dense, dense_lens = _inputs(m, n_img=1, n_txt=1)
    assert m.selection_ratio is None
    assert m.selection_trace(img, caps, lens, dense, dense_lens) is None


def test_forward_shapes_and_global_embeddings(name):
    m = _build(name)
    img, caps, lens, dense, dense_lens = _inputs(m)
    with torch.no_grad():
        out = m(img, caps, lens, dense, dense_lens)
        gi, gt = m.global_embed(img, caps, lens)
    assert isinstance(out, MatcherOutput)
    assert out.sims.shape == (3, 5) and out.sims.dtype == torch.float32 and torch.isfinite(out.sims).all()
    for decision in out.decisions:
        assert decision.shape[0] == 3 and decision.shape[-1] == N_PATCHES and decision.shape[1] in (1, 5)
    assert gi.shape == (3, DIM) and gt.shape == (5, DIM)
    assert torch.allclose(gi.norm(dim=1), torch.ones(3)) and torch.allclose(gt.norm(dim=1), torch.ones(5))


def test_engine_equals_forward(name):
    m = _build(name)
    img, caps, lens, dense, dense_lens = _inputs(m, n_img=4, n_txt=5)
    with torch.no_grad():
        want = m(img, caps, lens, dense if m.consumes_dense else None, dense_lens).sims
    got = score_matrix(m, img, caps, lens, dense, dense_lens, txt2img=torch.arange(5) % 4, max_memory_mb=1)
    assert torch.allclose(got, want, atol=1e-5), (engine_for(m).name, (got - want).abs().max())


def test_one_query_column_equals_the_pair_path(name):
    # Search re-ranks one caption against its shortlist as a (k, 1) matrix with ``score``; two-stage
    # evaluation scores listed pairs with ``score_pairs``: the same numbers either way.
    from patchword.eval.engine.core import prepare_inputs

    m = _build(name)
    img, caps, lens, dense, dense_lens = _inputs(m, n_img=4, n_txt=1)
    dense = (dense, dense_lens) if m.consumes_dense and m.dense_pairing == "image" else (None, None)
    inputs = prepare_inputs(m, img, caps, lens, *dense, None)
    engine, cpu = engine_for(m), torch.device("cpu")
    column = torch.empty(4, 1)
    engine.score(inputs, column, budget=1 << 24, device=cpu, progress=False)
    pairs = engine.score_pairs(
        inputs, torch.arange(4), torch.zeros(4, dtype=torch.long), budget=1 << 24, device=cpu
    )
    torch.testing.assert_close(column[:, 0], pairs, rtol=1e-5, atol=1e-6)


def test_state_dict_round_trip(name):
    m = _build(name)
    img, caps, lens, dense, dense_lens = _inputs(m)
    with torch.no_grad():
        before = m(img, caps, lens, dense, dense_lens).sims
    torch.manual_seed(123)  # a different initialisation...
    other = build_matcher(name, **_geometry(name)).eval()
    other.load_state_dict(m.state_dict())  # ...restored from the state dict (buffers included)
    with torch.no_grad():
        after = other(img, caps, lens, dense, dense_lens).sims
    assert torch.equal(before, after)


def test_dense_text_is_read_only_when_declared(name):
    m = _build(name)
    img, caps, lens, dense, dense_lens = _inputs(m)
    with torch.no_grad():
        with_dense = m(img, caps, lens, dense, dense_lens).sims
        without = m(img, caps, lens).sims
    if m.consumes_dense:
        assert not torch.allclose(with_dense, without)
    else:
        assert torch.equal(with_dense, without)


@pytest.mark.parametrize("region", REGION)
def test_region_matchers_refuse_a_cls_token(region):
    with pytest.raises(ValueError, match=f"matcher {region!r} takes image tokens without a CLS token") as err:
        build_matcher(region, embed_dim=DIM, num_patches=N_PATCHES, has_cls=True)
    assert "use a Swin backbone (model.hf_vision) or region features (model.image_encoder=precomp)" in str(
        err.value
    )
    assert not _build(region).has_cls  # built without one, it takes its tokens as regions


@pytest.mark.parametrize("region", REGION)
def test_a_region_matcher_on_a_vit_backbone_says_what_to_use(region, tiny_hf):
    """A ViT puts a CLS token first (known once its config is read): the refusal names what to use, not
    only the internal ``has_cls=True``."""
    from patchword.errors import ConfigError
    from patchword.model import ModelConfig, build_model

    _, vit = tiny_hf
    cfg = ModelConfig(matcher=region, image_encoder="hf", hf_vision=str(vit), embed_dim=16)
    with pytest.raises(ConfigError) as err:
        build_model(cfg, vocab_size=40)
    assert "the image encoder puts a CLS token first (a ViT, the tiny encoder)" in str(err.value)


@pytest.mark.parametrize("region", REGION)
def test_a_region_matcher_on_a_swin_backbone_scores_its_patches_as_regions(region, tmp_path):
    """What the refusal above suggests works: a Swin backbone puts no CLS token first."""
    transformers = pytest.importorskip("transformers")
    from patchword.model import ModelConfig, build_model

    swin = transformers.SwinConfig(
        image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 1], window_size=2
    )
    transformers.SwinModel(swin).save_pretrained(tmp_path / "swin")
    cfg = ModelConfig(matcher=region, image_encoder="hf", hf_vision=str(tmp_path / "swin"), embed_dim=16)
    model = build_model(cfg, vocab_size=40).eval()
    assert not model.image_encoder.has_cls and model.image_encoder.num_patches == 16
    with torch.no_grad():
        sims = model(torch.randn(2, 3, 32, 32), torch.randint(4, 40, (3, 6)), torch.tensor([6, 5, 4])).sims
    assert sims.shape == (2, 3) and torch.isfinite(sims).all()


def test_a_float64_matcher_scores_in_float64(name):
    """``precision=fp64`` trains a float64 model: no step may round the scores back to float32."""
    m = _build(name)
    img, caps, lens, dense, dense_lens = _inputs(m)
    dense = dense if m.consumes_dense else None
    with torch.no_grad():
        single = m(img, caps, lens, dense, dense_lens).sims
        double = m.double()(
            img.double(), caps.double(), lens, None if dense is None else dense.double(), dense_lens
        )
    assert double.sims.dtype == torch.float64
    torch.testing.assert_close(double.sims.float(), single, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("image_dtype", "text_dtype"), [(torch.float64, torch.float32), (torch.float32, torch.float64)]
)
def test_mixed_float_inputs_score_as_the_image_tokens_dtype(name, image_dtype, text_dtype):
    """Image and caption tokens of two float dtypes (float64 features beside float32 ones) are scored as
    if the text had the image tokens' dtype, by every matcher (VSE, CLIP and FILIP failed in a matrix
    product on the mixed dtypes, and VSE's and CLIP's exact engine too)."""
    m = _build(name)
    img, caps, lens, dense, dense_lens = _inputs(m)
    img, caps = img.to(image_dtype), caps.to(text_dtype)
    dense = dense.to(text_dtype) if m.consumes_dense else None
    with torch.no_grad():
        mixed = m(img, caps, lens, dense, dense_lens).sims
        same = m(
            img, caps.to(image_dtype), lens, None if dense is None else dense.to(image_dtype), dense_lens
        )
    assert mixed.dtype == same.sims.dtype
    torch.testing.assert_close(mixed, same.sims, rtol=1e-6, atol=1e-7)
    # the exact engine (float32 scores) takes them as the forward does
    engine = score_matrix(m, img, caps, lens, dense, dense_lens)
    torch.testing.assert_close(engine.double(), mixed.double(), rtol=1e-5, atol=1e-6)


def _wrong_values(name: str) -> list[tuple[str, object, type]]:
    """(field, a value its annotation refuses, the error) for each bool, int, float or Literal field of the
    matcher's config."""
    import typing

    wrong = []
    hints = typing.get_type_hints(matcher_config_class(name))
    for field, hint in hints.items():
        options = [a for a in (typing.get_args(hint) or (hint,)) if a is not type(None)]
        if typing.get_origin(hint) is typing.Literal:
            options = [hint]
        kind = options[0] if len(options) == 1 else None
        if kind is bool:
            wrong.append((field, "yes", TypeError))
        elif kind is int:
            wrong.append((field, 2.5, TypeError))
        elif kind is float:
            wrong.append((field, True, TypeError))
            wrong += [(field, math.nan, ValueError), (field, math.inf, ValueError)]  # NaN scores everywhere
        elif typing.get_origin(kind) is typing.Literal:
            wrong.append((field, "no-such-choice", ValueError))
    return wrong


def test_every_option_of_the_wrong_type_or_choice_is_refused_by_name(name):
    """The annotations of each matcher's config are checked when it is built from Python, as a run config's
    are when read: NAAF took ``min_samples=2.5``, SEPS ``saliency="foo"`` (silently the mean patch),
    FILIP and TGDT failed in a comparison deep inside their constructors."""
    wrong = _wrong_values(name)
    assert wrong  # every config has such fields: the loop below checks something
    for field, value, error in wrong:
        with pytest.raises(error, match=f"^{field} must be "):
            build_matcher(name, **{**_geometry(name), field: value})
