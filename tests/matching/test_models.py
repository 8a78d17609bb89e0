"""Named model configs (``create_model`` / ``list_models``), checked for every shipped name as timm checks
every model: each builds (randomly initialised, no download), has the documented token geometry, and
scores a tiny batch."""

from __future__ import annotations

import pytest
import torch

from patchword import create_model, get_model_config, list_models
from patchword.data.tokenizers.word import WordVocab
from patchword.errors import ConfigError
from patchword.factory import DEFAULT_VOCAB
from patchword.model import build_model
from patchword.pretrained import resolve_vocab_path

# Spatial tokens and CLS of the image encoder each named backbone implies.
GEOMETRY = {
    "vit-b16": (196, True),
    "swin-b-224": (49, False),
    "swin-b-384": (144, False),
    "precomp": (36, False),
    "tiny": (64, True),
    "tiny-32": (16, True),  # 32 px in 8 px patches
    "tiny-16": (16, True),
    "tiny-regions": (36, False),
}


def _geometry(name: str) -> tuple[int, bool]:
    for key in sorted(GEOMETRY, key=len, reverse=True):  # "tiny-regions" before "tiny"
        if name.endswith(key) or f"-{key}-" in name:
            return GEOMETRY[key]
    raise AssertionError(f"add {name} to GEOMETRY")


@pytest.fixture(params=list_models())
def name(request):
    return request.param


def test_the_issue_names_ship():
    assert {
        "seps-vit-b16-code",
        "laps-swin-b-384",
        "scan-t2i-precomp",
        "tgdt-precomp",
        "seps-tiny-paper",
    } <= set(list_models())


def test_named_model_builds_with_no_arguments_with_its_geometry_and_scores_a_batch(name):
    model = create_model(name, pretrained=False).eval()
    cfg = get_model_config(name)
    if cfg.text_encoder in ("tiny", "gru"):  # word ids: the shipped synthetic vocabulary by default
        assert model.text_encoder.vocab_size == len(WordVocab.load(resolve_vocab_path(DEFAULT_VOCAB)))
    patches, cls = _geometry(name)
    # TGDT's region transformer prepends a global token
    cls = cls or bool(cfg.precomp.context.global_token and cfg.image_encoder == "precomp")
    assert model.image_encoder.num_patches == patches and model.image_encoder.has_cls == cls
    assert model.matcher.embed_dim == cfg.embed_dim
    if cfg.image_encoder == "precomp":
        images = torch.rand(2, cfg.precomp.num_regions, cfg.precomp.region_dim)
    else:
        size = model.image_encoder.image_size
        images = torch.randn(2, 3, size, size)
    ids = torch.tensor([[2, 5, 6, 7, 3], [2, 8, 3, 0, 0], [2, 9, 10, 3, 0]])
    lens = torch.tensor([5, 3, 4])
    with torch.no_grad():
        sims = model(images, ids, lens).sims
    assert sims.shape == (2, 3) and torch.isfinite(sims).all()


def test_overrides_and_unknown_names():
    cfg = get_model_config("seps-vit-b16-code", embed_dim=256, seps={"sparse_ratio": 0.6})
    assert cfg.embed_dim == 256 and cfg.seps.sparse_ratio == 0.6 and cfg.seps.variant == "code"
    with pytest.raises(ConfigError, match="unknown model 'seps-vit-b99'"):
        get_model_config("seps-vit-b99")
    with pytest.raises(ConfigError, match="model.seps.variant"):
        get_model_config("seps-vit-b16-code", seps={"variant": "papr"})


@pytest.mark.parametrize("name", ["vse-tiny", "scan-t2i-precomp"])
def test_a_word_encoder_without_a_vocabulary_size_is_one_error_naming_the_argument(name):
    with pytest.raises(ConfigError, match="^vocab_size: .*vocabulary size"):
        build_model(get_model_config(name))
    assert create_model(name, pretrained=False, vocab_size=40).text_encoder.vocab_size == 40


def test_create_model_and_transforms_gives_a_matching_tokenizer_and_preprocessing():
    from PIL import Image

    from patchword import create_model_and_transforms

    torch.manual_seed(0)
    model, tokenizer, preprocess = create_model_and_transforms("seps-tiny-32", pretrained=False)
    torch.manual_seed(0)
    same = create_model("seps-tiny-32", pretrained=False)
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), same.state_dict().values(), strict=True)
    )
    pixels = preprocess(Image.new("RGB", (50, 40), (200, 30, 30)))
    assert pixels.shape == (3, 32, 32)
    ids, lens = tokenizer.batch_encode(["a large red circle", "two small squares"])
    assert int(ids.max()) < model.text_encoder.vocab_size
    with torch.no_grad():
        sims = model.eval()(pixels[None], ids, lens).sims
    assert sims.shape == (1, 2) and torch.isfinite(sims).all()
    regions = create_model_and_transforms("scan-tiny-regions", pretrained=False)
    assert regions[2] is None  # region features: no image preprocessing


def test_a_run_config_names_its_model_and_overrides_apply_on_top_in_any_order():
    from patchword.config import apply_overrides
    from patchword.runs.config import RunConfig

    for overrides in (
        ["model.embed_dim=64", "model.name=seps-tiny-paper"],
        ["model.name=seps-tiny-paper", "model.embed_dim=64"],
    ):
        cfg = apply_overrides(RunConfig(), overrides)
        assert (cfg.model.name, cfg.model.embed_dim, cfg.model.seps.variant) == (
            "seps-tiny-paper",
            64,
            "paper",
        )
        assert cfg.model.tiny_vit.image_size == 64
    with pytest.raises(ConfigError, match="model.name: unknown model 'seps-tiny-papr'"):
        apply_overrides(RunConfig(), ["model.name=seps-tiny-papr"])


def test_a_mapping_for_a_section_sets_those_keys_and_keeps_the_others():
    """``model.seps={detach_selection: true}`` rebuilt the section from the class defaults: the run's (or an
    earlier override's) sparse_ratio went back to 0.5 without a word, which changes the scores."""
    from patchword.config import apply_overrides
    from patchword.runs.config import RunConfig

    base = apply_overrides(RunConfig(), ["model.name=seps-tiny-paper", "model.seps.sparse_ratio=0.3"])
    cfg = apply_overrides(base, ["model.seps={detach_selection: true, caption_chunk: 2}", "train={lr: 0.5}"])
    assert (cfg.model.seps.sparse_ratio, cfg.model.seps.variant) == (0.3, "paper")
    assert (cfg.model.seps.detach_selection, cfg.model.seps.caption_chunk, cfg.train.lr) == (True, 2, 0.5)
    assert cfg.train.epochs == base.train.epochs
    with pytest.raises(ConfigError, match="model.seps.nope: unknown config key"):
        apply_overrides(base, ["model.seps={nope: 1}"])


def test_every_shipped_recipe_loads_and_names_a_shipped_model():
    from patchword.runs.config import list_recipes, load_run_config

    recipes = list_recipes()
    assert {"demo", "pretrain-synthetic-64", "synthetic_seps_paper", "f30k_seps_vit224"} <= set(recipes)
    for recipe in recipes:
        cfg = load_run_config(recipe)
        assert cfg.model.name in list_models() or cfg.model.matcher in ("clip", "filip"), recipe
