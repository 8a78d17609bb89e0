"""Importing official SEPS / LAPS checkpoints (``patchword.imports.seps``).

Each checkpoint is written the way the official ``train.py`` writes ``model_best.pth``: the VSEModel's state
dict under its official keys (transformers 4 backbone key names, the backbones' pooling layers, the Swin
index buffers) and an ``argparse.Namespace`` with every field of the official ``arguments.py``, built from
tiny random backbones with every tensor moved off its initialisation. The imported run must score pixels and
token ids as the official forward does (``patchword.testing.official_seps``, which reads the official keys
through transformers' own ``from_pretrained`` and runs the official per-caption loop).
"""

from __future__ import annotations

import collections
import json
import os
import pathlib

import pytest
import torch
import transformers  # a dev dependency: a missing one fails collection, never skips

from patchword.errors import ConfigError, DataError
from patchword.imports import ImportOptions, import_checkpoint, list_families
from patchword.runs import load_run, read_run_config
from patchword.testing.official_seps import (
    BERT,
    SWIN,
    VIT,
    VOCAB,
    OfficialSEPS,
    official_checkpoint,
)

pytestmark = pytest.mark.usefixtures("one_thread")

#: float32 agreement required between the imported run and the official forward.
TOLERANCE = 1e-4


class OfficialOrderedDict(collections.OrderedDict):
    """A class the restricted unpickler must refuse to build."""


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """Tiny Hugging Face directories as save_pretrained writes them: ``vit``, ``swin``, ``bert`` (with its
    ``vocab.txt``) and ``vit32`` (a ViT twice as wide as the checkpoints')."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    transformers.ViTModel(transformers.ViTConfig(**VIT), add_pooling_layer=False).save_pretrained(
        root / "vit"
    )
    wide = {**VIT, "hidden_size": 32}
    transformers.ViTModel(transformers.ViTConfig(**wide), add_pooling_layer=False).save_pretrained(
        root / "vit32"
    )
    transformers.SwinModel(transformers.SwinConfig(**SWIN)).save_pretrained(root / "swin")
    transformers.BertModel(transformers.BertConfig(**BERT)).save_pretrained(root / "bert")
    (root / "bert" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return {name: root / name for name in ("vit", "vit32", "swin", "bert")}


def _inputs(seed: int = 1):
    """3 images, 6 captions (2 per image), one dense caption per image; ids padded with 0."""
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randn(3, 3, 32, 32, generator=gen)

    def texts(lengths):
        ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
        for row, n in enumerate(lengths):
            ids[row, :n] = torch.cat(
                [torch.tensor([2]), torch.randint(5, len(VOCAB), (n - 2,), generator=gen), torch.tensor([3])]
            )
        return ids, torch.tensor(lengths)

    cap_ids, cap_lens = texts([5, 7, 4, 9, 6, 8])
    dense_ids, dense_lens = texts([20, 27, 16])
    return pixels, cap_ids, cap_lens, dense_ids, dense_lens, torch.tensor([0, 0, 1, 1, 2, 2])


def _architecture(path) -> dict:
    return transformers.AutoConfig.from_pretrained(path).to_dict()


def _nothing_written(runs: pathlib.Path) -> None:
    assert not runs.exists() or not any(runs.iterdir()), sorted(p.name for p in runs.iterdir())


# ------------------------------------------------------------------------------------------ equivalence

CASES = [  # family, backbone, dense pairing, token width, transformers 4 key names
    ("seps", "vit", "image", 24, True),
    ("seps", "vit", "caption", 24, False),
    ("seps", "swin", "image", 16, True),
    ("seps", "swin", "caption", 24, True),
    ("laps", "vit", None, 24, True),
    ("laps", "swin", None, 16, False),
]


@pytest.mark.parametrize(("family", "kind", "pairing", "embed", "v4"), CASES)
def test_imported_run_scores_as_the_official_forward(tmp_path, hf_dirs, family, kind, pairing, embed, v4):
    from patchword.eval.engine import score_matrix

    ratios = {"sparse": 0.8, "aggr": 0.6} if kind == "swin" else {}  # the README's Swin ratios
    ckpt = official_checkpoint(kind, embed=embed, v4=v4, **ratios)
    path = tmp_path / "model_best.pth"
    torch.save(ckpt, path)
    out = tmp_path / "run"
    options = ImportOptions(hf_vision=str(hf_dirs[kind]), hf_text=str(hf_dirs["bert"]), dense_pairing=pairing)
    record = import_checkpoint(path, out, family_name=family, options=options)

    assert record["family"] == family
    assert record["metadata"] == {"epoch": 12, "best_rsum": 512.5, "Eiters": 4242}
    pooler = [k for k in ckpt["model"] if ".pooler." in k]
    assert all(record["ignored"][k].startswith("pooling layer") for k in pooler) and pooler
    loaded = set(ckpt["model"]) - set(record["ignored"])
    assert record["loaded"] == len(loaded)

    run = load_run(out)
    cfg = run.config
    assert (cfg.model.matcher, cfg.model.seps.variant, cfg.model.seps.detach_selection) == (
        family,
        "code",
        family == "seps",
    )
    assert cfg.model.seps.dense_pairing == (pairing or "image")
    assert (cfg.model.seps.sparse_ratio, cfg.model.seps.aggr_ratio) == (
        ckpt["opt"].sparse_ratio,
        ckpt["opt"].aggr_ratio,
    )
    assert (cfg.data.tokenizer, cfg.data.dense, cfg.data.max_caption_len) == ("bert", family == "seps", 64)
    ids, lens = run.tokenize(["w3 W7"])
    assert ids.tolist() == [[2, VOCAB.index("w3"), VOCAB.index("w7"), 3]] and lens.tolist() == [4]

    pixels, cap_ids, cap_lens, dense_ids, dense_lens, txt2img = _inputs()
    official = OfficialSEPS(
        ckpt["model"],
        ckpt["opt"],
        _architecture(hf_dirs[kind]),
        _architecture(hf_dirs["bert"]),
        dense=family == "seps",
    )
    reference = official.scores(
        pixels, cap_ids, cap_lens, dense_ids, dense_lens, pairing=pairing or "caption", dense_index=txt2img
    )
    model = run.model
    caption_tied = pairing == "caption"
    with torch.no_grad():
        img = model.encode_images(pixels)
        cap = model.encode_texts(cap_ids, cap_lens)
        dense = model.encode_texts(dense_ids, dense_lens) if family == "seps" else None
        engine = score_matrix(
            model.matcher, img, cap, cap_lens, dense, dense_lens if dense is not None else None,
            txt2img=txt2img if caption_tied else None,
        )  # fmt: skip
        rows = txt2img if caption_tied else torch.arange(3)
        forward = model(pixels, cap_ids, cap_lens, dense_ids[rows], dense_lens[rows]).sims
    for name, sims in (("engine", engine), ("forward", forward)):
        diff = (sims - reference).abs().max().item()
        print(f"{family}-{kind}-{pairing}: {name} vs official max |diff| = {diff:.2e}")
        assert diff <= TOLERANCE, (name, diff)
    # The scores are not degenerate: captions rank images differently, and the dense branch counts.
    assert reference.std() > 1e-2
    if family == "seps":
        assert (reference - official.scores(pixels, cap_ids, cap_lens)).abs().min() > 1e-2


def test_dense_pairings_agree_on_ground_truth_pairs(hf_dirs):
    """The official protocol and the leak-free one differ only where a caption meets another image."""
    ckpt = official_checkpoint("vit", embed=24, seed=3)
    official = OfficialSEPS(
        ckpt["model"], ckpt["opt"], _architecture(hf_dirs["vit"]), _architecture(hf_dirs["bert"]), dense=True
    )
    pixels, cap_ids, cap_lens, dense_ids, dense_lens, txt2img = _inputs(seed=4)
    leaky = official.scores(
        pixels, cap_ids, cap_lens, dense_ids, dense_lens, pairing="caption", dense_index=txt2img
    )
    leak_free = official.scores(pixels, cap_ids, cap_lens, dense_ids, dense_lens, pairing="image")
    diagonal = txt2img, torch.arange(len(txt2img))
    torch.testing.assert_close(leaky[diagonal], leak_free[diagonal], rtol=0, atol=1e-6)
    assert (leaky - leak_free).abs().max() > 1e-3


def test_both_families_recognise_the_layout():
    """SEPS and LAPS save the same keys and opt fields: both importers claim it, --family decides."""
    ckpt = official_checkpoint("vit", embed=24)
    assert [f.name for f in list_families() if f.detect(ckpt)] == ["laps", "seps"]
    scan_like = {"model": [ckpt["model"], ckpt["model"]], "opt": ckpt["opt"]}
    assert not any(f.name in ("laps", "seps") and f.detect(scan_like) for f in list_families())


# ------------------------------------------------------------------------------------------ bad inputs


def _import_fails(tmp_path, ckpt, hf_dirs, error, *, family="seps", vision="vit", text="bert", **options):
    """Import ``ckpt`` (a dict to save, or bytes to write) and return the error; nothing may be written."""
    path = tmp_path / "model_best.pth"
    if isinstance(ckpt, bytes):
        path.write_bytes(ckpt)
    else:
        torch.save(ckpt, path)
    runs = tmp_path / "runs"
    hf = ImportOptions(
        hf_vision=str(hf_dirs[vision]) if vision else None,
        hf_text=str(hf_dirs[text]) if text else None,
        **options,
    )
    with pytest.raises(error) as caught:
        import_checkpoint(path, runs / "imported", family_name=family, options=hf)
    _nothing_written(runs)
    return caught.value, path


def test_checkpoint_of_another_family_is_refused(tmp_path, hf_dirs):
    ckpt = official_checkpoint("vit", embed=24)
    scan_like = {"model": [ckpt["model"], ckpt["model"]], "opt": ckpt["opt"], "epoch": 3}
    err, path = _import_fails(tmp_path, scan_like, hf_dirs, DataError)
    assert str(path) in str(err) and "not a seps checkpoint" in str(err)


def test_wider_hf_vision_names_the_tensor(tmp_path, hf_dirs):
    ckpt = official_checkpoint("vit", embed=24)
    err, path = _import_fails(tmp_path, ckpt, hf_dirs, DataError, vision="vit32")
    assert str(path) in str(err)
    assert "img_enc.visual_encoder.embeddings.cls_token" in str(err) and "--hf-vision" in str(err)


@pytest.mark.parametrize(
    ("what", "named"),
    [("subclass", "OfficialOrderedDict"), ("path", "Path")],
)
def test_classes_outside_the_allow_list_are_refused(tmp_path, hf_dirs, what, named):
    ckpt = official_checkpoint("vit", embed=24)
    if what == "subclass":
        ckpt["model"] = OfficialOrderedDict(ckpt["model"])
    else:
        ckpt["opt"].data_path = pathlib.Path("data")
    err, path = _import_fails(tmp_path, ckpt, hf_dirs, DataError)
    assert named in str(err) and str(path) in str(err)


def test_truncated_checkpoint(tmp_path, hf_dirs):
    source = tmp_path / "whole.pth"
    torch.save(official_checkpoint("vit", embed=24), source)
    data = source.read_bytes()
    err, path = _import_fails(tmp_path, data[: len(data) * 2 // 3], hf_dirs, DataError)
    assert str(path) in str(err) and "not a readable checkpoint" in str(err)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"vit_type": "clip"}, "opt.vit_type"),
        ({"vit_type": "swin"}, "--hf-vision"),  # a Swin checkpoint's opt with a ViT architecture
        ({"sparse_ratio": 1.5}, "opt.sparse_ratio"),
        ({"aggr_ratio": 0.01}, "opt.sparse_ratio"),  # no aggregated token left: N_c = 0
        ({"dataset": "cc3m"}, "opt.dataset"),
        ({"num_patches": 196}, "opt.num_patches"),
        ({"img_res": 224}, "opt.img_res"),
        ({"max_word": "90"}, "opt.max_word"),
        ({"cross_attention": 1}, "opt.cross_attention"),  # a field the official code does not have
    ],
)
def test_opt_values_patchword_cannot_map(tmp_path, hf_dirs, changes, key):
    ckpt = official_checkpoint("vit", embed=24)
    for name, value in changes.items():
        setattr(ckpt["opt"], name, value)
    err, _ = _import_fails(tmp_path, ckpt, hf_dirs, ConfigError)
    assert err.key == key, str(err)


def test_option_errors(tmp_path, hf_dirs):
    ckpt = official_checkpoint("vit", embed=24)
    err, _ = _import_fails(tmp_path, ckpt, hf_dirs, ConfigError, family="laps", dense_pairing="caption")
    assert err.key == "--dense-pairing"
    err, _ = _import_fails(tmp_path, ckpt, hf_dirs, ConfigError, text=None)
    assert err.key == "--hf-text"


# ------------------------------------------------------------------------------------------ CLI


def test_cli_import(tmp_path, hf_dirs, capsys):
    from patchword.cli import main

    ckpt = official_checkpoint("swin", embed=24, dataset="coco")
    path = tmp_path / "model_best.pth"
    torch.save(ckpt, path)
    out = tmp_path / "run"
    argv = ["import", str(path), "--out", str(out), "--hf-vision", str(hf_dirs["swin"])]
    argv += ["--hf-text", str(hf_dirs["bert"]), "--family", "seps", "--dense-pairing", "caption"]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["family"] == "seps" and f"written: {out}" in printed.err
    run = load_run(out)
    assert run.config.model.seps.dense_pairing == "caption"
    assert (run.config.data.test_split, run.config.eval.coco_1k) == ("testall", True)
    record = json.loads((out / "import.json").read_text())
    assert record["family"] == "seps" and record["opt"]["vit_type"] == "swin"
    assert "txt_enc.bert.pooler.dense.weight" in record["ignored"]
    assert any(k.endswith("relative_position_index") for k in record["ignored"])
    assert main(argv) == 2  # the run exists: never overwritten


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.seps.similarity=cosine", "model.seps.similarity"),
        ("model.seps.aggr_ratio=0.45", "model.seps.aggr_ratio"),
        # f715cbc: a shape error blamed on "the model built from its opt", which the override had changed
        ("model.embed_dim=32", "model.embed_dim"),
    ],
)
def test_model_overrides_that_contradict_the_checkpoint_are_refused(tmp_path, hf_dirs, override, key):
    """f715cbc imported with these overrides silently (eval 253.3 instead of the official model's 243.3,
    nothing recorded): the model is what the checkpoint says, so the key is named and nothing written."""
    ckpt = official_checkpoint("vit", embed=24)
    err, _ = _import_fails(tmp_path, ckpt, hf_dirs, ConfigError, overrides=[override])
    assert err.key == key and "contradicts the seps checkpoint" in str(err)


def test_data_overrides_are_accepted_and_flags_a_family_ignores_are_refused(tmp_path, hf_dirs):
    ckpt = official_checkpoint("vit", embed=24)
    err, _ = _import_fails(tmp_path, ckpt, hf_dirs, ConfigError, vocab=str(tmp_path / "vocab.json"))
    assert err.key == "--vocab" and "does not use it" in str(err)  # f715cbc ignored it
    path = tmp_path / "ok.pth"
    torch.save(ckpt, path)
    options = ImportOptions(
        hf_vision=str(hf_dirs["vit"]), hf_text=str(hf_dirs["bert"]), overrides=["data.root=elsewhere"]
    )
    import_checkpoint(path, tmp_path / "run", family_name="seps", options=options)
    assert load_run(tmp_path / "run").config.data.root == os.path.abspath("elsewhere")  # recorded absolute


def test_an_evaluation_split_without_its_dense_captions_is_refused_on_import(tmp_path, hf_dirs):
    """Old code imported a SEPS checkpoint with eval.split=dev (the release has no dev-split dense captions)
    and every evaluation of the run then failed; with the file named the import goes ahead."""
    ckpt = official_checkpoint("vit", embed=24)
    err, _ = _import_fails(tmp_path, ckpt, hf_dirs, ConfigError, overrides=["eval.split=dev"])
    assert err.key == "data.dense_dev" and "reads dense captions on the dev split" in str(err)
    path = tmp_path / "ok.pth"
    torch.save(ckpt, path)
    options = ImportOptions(
        hf_vision=str(hf_dirs["vit"]),
        hf_text=str(hf_dirs["bert"]),
        overrides=["eval.split=dev", "data.dense_dev=d.jsonl"],
    )
    import_checkpoint(path, tmp_path / "run", family_name="seps", options=options)
    assert read_run_config(tmp_path / "run").data.dense_dev.endswith("d.jsonl")
