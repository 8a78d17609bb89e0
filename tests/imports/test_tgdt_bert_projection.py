"""TGDT with a BERT text encoder whose width differs from the joint space: the text projection is one
``Linear`` under one name, so ``patchword train`` ends with its export and ``patchword export`` of a trained
or imported run writes safetensors (old code: the projection also under ``text_encoder.proj.*``, a shared
tensor that safetensors refuses). Weights saved with both names by earlier versions still load."""

from __future__ import annotations

import json

import pytest
import torch
import transformers  # a dev dependency: a missing one fails collection, never skips
from test_import_tgdt_ucmfh import WORDS, bert_config, captions, official_config, write_tgdt

from conftest import TINY_REGIONS, TINY_TGDT
from patchword import create_model
from patchword.checkpoint import load_checkpoint
from patchword.cli import main
from patchword.errors import ConfigError
from patchword.imports import ImportOptions, import_checkpoint
from patchword.runs import load_run

pytestmark = pytest.mark.usefixtures("one_thread")

PROJ = ("text_encoder.base.proj.weight", "text_encoder.base.proj.bias")


def scores(model, regions, ids, lens):
    """(B_img, B_txt) evaluation scores of a retrieval model."""
    with torch.no_grad():
        return model.eval()(regions, ids, lens).sims


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    """A TGDT run trained 2 steps on synthetic regions with a 16-d BERT and an 8-d joint space."""
    root = tmp_path_factory.mktemp("tgdt_bert")
    bert = root / "bert"
    transformers.BertModel(bert_config()).save_pretrained(bert)
    (bert / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    overrides = [
        *TINY_REGIONS,
        *TINY_TGDT,
        "model.text_encoder=bert",
        f"model.hf_text={bert}",
        "data.tokenizer=bert",
        f"data.bert_vocab={bert / 'vocab.txt'}",
        "data.max_caption_len=16",
        "model.max_text_len=16",
        "model.embed_dim=8",
        "train.max_steps=2",
        f"output_dir={root / 'runs'}",
        "name=tgb",
    ]
    rc = main(["train", *overrides])
    return rc, root / "runs" / "tgb"


def region_inputs(regions=14, dim=16):
    gen = torch.Generator().manual_seed(3)
    _, ids, lens = captions()
    return torch.randn(3, regions, dim, generator=gen), ids, lens


def test_trained_tgdt_bert_run_finishes_and_its_export_scores_as_the_run(bert_run, tmp_path):
    rc, run = bert_run
    assert rc == 0 and (run / "summary.json").is_file()  # old code: rc 1 from export_weights, no summary
    saved = load_checkpoint(run / "best.pt")["model"]
    assert saved["text_encoder.base.proj.weight"].shape == (8, 16)
    assert not [k for k in saved if k.startswith("text_encoder.proj.")]
    out = tmp_path / "exp"
    assert main(["export", str(run), str(out)]) == 0
    regions, ids, lens = region_inputs()
    ours = scores(load_run(run).model, regions, ids, lens)
    exported = scores(create_model(str(out)), regions, ids, lens)
    assert ours.shape == (3, 5) and ours.std() > 0
    assert torch.allclose(exported, ours, atol=1e-6, rtol=0)


def old_format(run, tmp_path, *, alias_offset=0.0):
    """A copy of ``run`` whose best.pt holds the projection under both names, as earlier versions saved."""
    old = tmp_path / "old_run"
    old.mkdir()
    for path in run.iterdir():
        if path.is_file():
            (old / path.name).write_bytes(path.read_bytes())
    ckpt = load_checkpoint(run / "best.pt")
    for key in PROJ:
        alias = key.replace("text_encoder.base.proj.", "text_encoder.proj.")
        ckpt["model"][alias] = ckpt["model"][key].clone() + alias_offset
    torch.save(ckpt, old / "best.pt")
    return old


def test_weights_saved_with_the_projection_under_both_names_still_load(bert_run, tmp_path):
    _, run = bert_run
    old = old_format(run, tmp_path)
    regions, ids, lens = region_inputs()
    loaded = load_run(old).model
    assert torch.equal(scores(loaded, regions, ids, lens), scores(load_run(run).model, regions, ids, lens))
    assert loaded.text_encoder.proj is loaded.text_encoder.base.proj  # the attribute still reads it
    assert main(["export", str(old), str(tmp_path / "exp")]) == 0  # and such a run exports
    # only the alias, without its base key (not written by any version): taken as the base key
    state = load_checkpoint(old / "best.pt")["model"]
    for key in PROJ:
        del state[key]
    model = load_run(run).model
    with torch.no_grad():
        model.text_encoder.base.proj.weight.zero_()
    model.load_state_dict(state, strict=True)
    assert torch.equal(model.text_encoder.base.proj.weight, loaded.text_encoder.base.proj.weight)


def test_an_alias_that_differs_from_its_base_key_is_refused(bert_run, tmp_path):
    _, run = bert_run
    old = old_format(run, tmp_path, alias_offset=1.0)
    with pytest.raises(
        ConfigError, match=r"text_encoder\.proj\.weight differs from text_encoder\.base\.proj"
    ):
        load_run(old)


@pytest.mark.parametrize(("name", "dataset"), [("f30k", "f30k"), ("coco", "coco"), ("f8k", None)])
def test_imported_tgdt_records_its_dataset_and_exports(tmp_path, name, dataset):
    """The official config's dataset.name reaches import.json (old code: always null); the imported run,
    BERT 16-d -> 8-d, exports (old code: shared tensors) and its export scores as the run."""
    bert = tmp_path / "bert"
    bert_config(layers=3).save_pretrained(bert)
    (bert / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    ckpt = tmp_path / "model_best_rsum.pth.tar"
    write_tgdt(ckpt, official_config(**{"dataset.name": name}))
    run = tmp_path / "run"
    record = import_checkpoint(ckpt, run, options=ImportOptions(hf_text=str(bert)))
    assert record["dataset"] == dataset
    assert json.loads((run / "import.json").read_text())["dataset"] == dataset
    saved = load_checkpoint(run / "best.pt")["model"]
    assert saved["text_encoder.base.proj.weight"].shape == (8, 16)
    assert not [k for k in saved if k.startswith("text_encoder.proj.")]
    if name != "f30k":
        return
    out = tmp_path / "exp"
    assert main(["export", str(run), str(out)]) == 0
    regions, ids, lens = region_inputs(36, 12)
    ours = scores(load_run(run).model, regions, ids, lens)
    assert torch.allclose(scores(create_model(str(out)), regions, ids, lens), ours, atol=1e-6, rtol=0)
