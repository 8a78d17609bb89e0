"""``create_model`` / ``create_model_and_transforms`` keep their documented contract: ``pretrained=False``
never reads a weights file, a saved model is accepted as ``str`` or ``Path`` by both, and the default word
vocabulary is that of the pretrained encoders the config names."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from patchword import create_model, create_model_and_transforms, get_model_config
from patchword.config import save_config
from patchword.data.tokenizers.word import WordVocab
from patchword.errors import MissingFileError
from patchword.model import ModelConfig
from patchword.pretrained import resolve_pretrained_dir
from patchword.runs.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")

VIT_WEIGHT = "embeddings.patch_embeddings.projection.weight"
BERT_WEIGHT = "embeddings.word_embeddings.weight"


def _saved(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


def _backbones(model) -> tuple[torch.nn.Module, torch.nn.Module]:
    return model.image_encoder.backbone, model.text_encoder.backbone


def _shapes(model) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _shapes(module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def test_pretrained_false_builds_an_unnamed_config_s_backbones_without_their_weights(tiny_hf):
    """Old code: a ModelConfig without ``name`` got ``random_init = {}`` and loaded the directories'
    weights although ``pretrained=False``."""
    bert, vit = tiny_hf
    cfg = ModelConfig(
        matcher="vse", image_encoder="hf", hf_vision=str(vit), text_encoder="bert", hf_text=str(bert)
    )
    loaded = create_model(cfg, embed_dim=16)
    torch.manual_seed(0)
    fresh = create_model(cfg, embed_dim=16, pretrained=False)
    assert torch.equal(_backbones(loaded)[0].state_dict()[VIT_WEIGHT], _saved(vit)[VIT_WEIGHT])
    assert torch.equal(_backbones(loaded)[1].state_dict()[BERT_WEIGHT], _saved(bert)[BERT_WEIGHT])
    for role, (new, old) in enumerate(zip(_backbones(fresh), _backbones(loaded), strict=True)):
        assert _shapes(new) == _shapes(old), role  # the directories' architecture...
        key = (VIT_WEIGHT, BERT_WEIGHT)[role]
        assert not torch.equal(new.state_dict()[key], old.state_dict()[key])  # ...randomly initialised


def test_pretrained_false_honours_hf_overrides_of_a_named_model(tiny_hf):
    """Old code: ``create_model("vse-vit-b16", hf_vision=tiny, pretrained=False)`` ignored the override and
    built the named model's ViT-B/16 and BERT-base (195M parameters)."""
    bert, vit = tiny_hf
    kwargs = dict(hf_vision=str(vit), hf_text=str(bert), embed_dim=16)
    loaded = create_model("vse-vit-b16", **kwargs)
    fresh = create_model("vse-vit-b16", pretrained=False, **kwargs)
    assert _shapes(fresh) == _shapes(loaded)
    assert fresh.image_encoder.backbone.config.hidden_size == 16
    assert fresh.text_encoder.backbone.config.vocab_size == 20
    assert (fresh.image_encoder.num_patches, fresh.image_encoder.image_size) == (16, 32)
    assert not torch.equal(fresh.image_encoder.backbone.state_dict()[VIT_WEIGHT], _saved(vit)[VIT_WEIGHT])
    assert sum(p.numel() for p in fresh.parameters()) == sum(p.numel() for p in loaded.parameters())


def test_pretrained_false_reads_an_overridden_source_s_architecture_and_names_it_when_missing():
    """The override is read (for its architecture), never skipped in favour of the named model's; the
    named model's own backbones use the architecture it ships (tests/matching/test_models.py builds them)."""
    with pytest.raises(MissingFileError, match="never-read"):
        create_model("vse-vit-b16", pretrained=False, hf_vision="/nonexistent/never-read")


def _export_directory(root: Path) -> tuple[Path, torch.nn.Module]:
    """A saved model as ``patchword export`` lays it out: config.yaml, vocab.json, model.safetensors."""
    directory = root / "model"
    directory.mkdir()
    save_config(RunConfig(model=get_model_config("vse-tiny-16")), directory / "config.yaml")
    shutil.copyfile(resolve_pretrained_dir("synthetic-64") / "vocab.json", directory / "vocab.json")
    torch.manual_seed(3)
    model = create_model("vse-tiny-16", pretrained=False)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors")
    )
    return directory, model


def test_a_saved_model_directory_is_accepted_as_str_or_path_by_both_factories(tmp_path):
    """Old code: ``create_model(Path(dir))`` raised AttributeError ('PosixPath' has no 'startswith') and
    ``create_model_and_transforms(dir)`` raised "model.name: unknown model"."""
    directory, model = _export_directory(tmp_path)
    words = WordVocab.load(directory / "vocab.json").idx2word
    for value in (str(directory), directory):
        assert _same_weights(create_model(value), model)
        built, tokenizer, preprocess = create_model_and_transforms(value)
        assert _same_weights(built, model)
        assert list(tokenizer.idx2word) == list(words)
        assert tuple(preprocess(Image.new("RGB", (50, 40))).shape) == (
            3,
            32,
            32,
        )  # vse-tiny-16 takes 32 px images
    with pytest.raises(ValueError, match="loaded as it is"):
        create_model_and_transforms(directory, embed_dim=8)
    with pytest.raises(MissingFileError, match="no-such-export"):
        create_model(tmp_path / "no-such-export")
    with pytest.raises(MissingFileError, match="has no config.yaml"):
        create_model_and_transforms(str(tmp_path))


def test_a_registered_name_wins_over_a_folder_of_that_name_in_the_working_directory(tmp_path, monkeypatch):
    """Old code: a folder ``seps-tiny-32/config.yaml`` in the working directory (a run named after its
    model) turned ``create_model("seps-tiny-32")`` into "checkpoint seps-tiny-32/best.pt does not exist"."""
    (tmp_path / "seps-tiny-32").mkdir()
    (tmp_path / "seps-tiny-32" / "config.yaml").write_text("name: x\n")
    monkeypatch.chdir(tmp_path)
    assert _shapes(create_model("seps-tiny-32", pretrained=False)) == _shapes(
        create_model(get_model_config("seps-tiny-32"), pretrained=False)
    )
    with pytest.raises(MissingFileError, match="best.pt"):  # the folder is still reachable as a path
        create_model("./seps-tiny-32")


def test_a_model_config_naming_only_a_registered_model_is_that_model():
    """Old code: ``create_model(ModelConfig(name="seps-tiny-32"))`` built the default architecture (512-d,
    64 px, 1.45M parameters) under that name; a resolved config is still taken as it is."""
    named = _shapes(create_model("seps-tiny-32", pretrained=False))
    assert _shapes(create_model(ModelConfig(name="seps-tiny-32"), pretrained=False)) == named
    assert _shapes(create_model(ModelConfig(), pretrained=False)) != named
    changed = create_model(ModelConfig(name="seps-tiny-32"), pretrained=False, embed_dim=16)
    assert _shapes(changed) == _shapes(create_model("seps-tiny-32", pretrained=False, embed_dim=16)) != named
    resolved = get_model_config("seps-tiny-32", embed_dim=ModelConfig().embed_dim)  # a run's model section
    assert _shapes(create_model(resolved, pretrained=False)) == _shapes(
        create_model("seps-tiny-32", pretrained=False, embed_dim=ModelConfig().embed_dim)
    )


def test_tiny_pretrained_encoders_bring_their_own_vocabulary():
    """Old code: the default vocabulary was always synthetic-64 (79 words), so cluttered-64's encoders
    (78 words) failed to load: ``token_embed.weight`` [78, 128] vs [79, 128]."""
    shipped = resolve_pretrained_dir("cluttered-64")
    words = WordVocab.load(shipped / "vocab.json").idx2word
    weights = load_file(str(shipped / "model.safetensors"))
    model = create_model("vse-tiny", tiny_pretrained="cluttered-64")
    (embed_key,) = [k for k in weights if k.endswith("token_embed.weight")]
    assert torch.equal(model.state_dict()[embed_key], weights[embed_key])
    built, tokenizer, _ = create_model_and_transforms("vse-tiny", tiny_pretrained="cluttered-64")
    assert torch.equal(built.state_dict()[embed_key], weights[embed_key])
    assert len(tokenizer) == weights[embed_key].shape[0]
    assert list(tokenizer.idx2word) == list(words)
    # an explicit vocabulary still wins, and a randomly initialised model keeps the named vocabulary's size
    assert len(create_model_and_transforms("vse-tiny", vocab="synthetic-64")[1]) != len(tokenizer)
    fresh = create_model("vse-tiny", tiny_pretrained="cluttered-64", pretrained=False)
    assert fresh.state_dict()[embed_key].shape == weights[embed_key].shape


def test_patchword_testing_exports_the_options_type_of_its_independent_reference():
    """Old code: ``patchword.testing`` exported ``independent_seps_scores`` but not ``SEPSOptions``, the type
    it takes (distinct from ``patchword.model.SEPSOptions``, the run config's ``model.seps`` section)."""
    import patchword.model
    import patchword.testing
    from patchword.matching import build_matcher
    from patchword.testing.seps_independent import SEPSOptions as defining

    assert "SEPSOptions" in patchword.testing.__all__
    options_type = patchword.testing.SEPSOptions
    assert options_type is defining and options_type is not patchword.model.SEPSOptions
    torch.manual_seed(0)
    laps = build_matcher("laps", embed_dim=8, num_patches=16, has_cls=True).double().eval()
    g = torch.Generator().manual_seed(1)
    img = torch.randn(3, 17, 8, generator=g, dtype=torch.float64)
    caps = torch.randn(4, 6, 8, generator=g, dtype=torch.float64)
    lens = torch.tensor([6, 3, 5, 2])
    with torch.no_grad():
        forward = laps(img, caps, lens).sims
        independent = patchword.testing.independent_seps_scores(
            options_type(sparse_ratio=0.5, aggr_ratio=0.4, has_cls=True), laps.state_dict(), img, caps, lens
        )
    assert torch.allclose(independent, forward, rtol=0, atol=1e-10)


DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("doc", ["densify.md", "benchmarks.md", "models.md"])
def test_every_patchword_name_these_docs_give_exists(doc):
    """Old docs named ``patchword.encoders.BertCaptionTokenizer`` (densify.md) and
    ``patchword.bench.reference_scores`` (benchmarks.md), neither of which exists."""
    import importlib
    import re

    names = set(re.findall(r"`(patchword(?:\.\w+)+)`", (DOCS / doc).read_text()))
    assert names, doc
    missing = []
    for name in sorted(names):
        parts = name.split(".")
        for split in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                found = importlib.import_module(".".join(parts[:split]))
            except ImportError:
                continue
            for attribute in parts[split:]:
                found = getattr(found, attribute, None)
            break
        if found is None:
            missing.append(name)
    assert missing == [], doc
