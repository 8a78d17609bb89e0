"""``patchword import`` of official SCAN / NAAF checkpoints: the imported run scores like the official code.

Checkpoints are built in the official layout (``{"model": [img_state, txt_state], "opt": Namespace, ...}``,
official parameter names, weights moved off their initialisation) and saved with ``torch.save``; the
yardstick is the official forward written from the reference notes
(:mod:`patchword.testing.official_scan_naaf`), run on those official state dicts.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import types
from pathlib import Path

import pytest
import torch

from patchword.errors import ConfigError, DataError
from patchword.imports import IMPORT_FILE, ImportOptions, import_checkpoint
from patchword.runs import load_run
from patchword.testing.official_scan_naaf import official_encoders, official_modules, official_similarities

pytestmark = pytest.mark.usefixtures("one_thread")

# fmt: off
WORDS = [
    "a", "man", "woman", "dog", "cat", "red", "blue", "green", "small", "big", "on", "in", "with",
    "near", "the", "ball", "car", "tree", "grass", "runs", "sits", "two", "boy", "girl", "street", "water",
]
# fmt: on
SCAN_SPECIALS = ["<pad>", "<start>", "<end>", "<unk>"]  # SCAN's vocab.py order
GLOVE_SPECIALS = ["<pad>", "<unk>", "<start>", "<end>"]  # NAAF's GloVe vocab (f30k_precomp.json)
EMBED, WORD_DIM, IMG_DIM, REGIONS = 16, 8, 12, 36
TOLERANCE = 1e-4


# ------------------------------------------------------------------------------ official checkpoints


#: The fields SCAN's and NAAF's train.py share, with their defaults (small sizes).
COMMON_OPT = dict(
    data_name="f30k_precomp",
    vocab_path="./vocab/",
    margin=0.2,
    batch_size=128,
    word_dim=WORD_DIM,
    embed_size=EMBED,
    grad_clip=2.0,
    num_layers=1,
    workers=10,
    logger_name="./runs/runX/log",
    model_name="./runs/runX/checkpoint",
    resume="",
    img_dim=IMG_DIM,
    no_imgnorm=False,
    no_txtnorm=False,
    precomp_enc_type="basic",
)


def scan_opt(**changes) -> argparse.Namespace:
    """Every field of the official SCAN train.py (the README's t-i LSE flags)."""
    scan = dict(
        data_path="/home/someone/data/", num_epochs=30, learning_rate=0.0002, lr_update=15, log_step=10
    )
    scan.update(val_step=500, max_violation=True, raw_feature_norm="clipped_l2norm", agg_func="LogSumExp")
    scan.update(cross_attn="t2i", bi_gru=True, lambda_lse=6.0, lambda_softmax=9.0)
    return argparse.Namespace(
        **{**COMMON_OPT, **scan, "vocab_size": len(SCAN_SPECIALS) + len(WORDS), **changes}
    )


def naaf_opt(**changes) -> argparse.Namespace:
    """Every field of the official NAAF train.py, its thresholds as a trained run leaves them."""
    naaf = dict(
        data_path="/home/zhangkun/data/", num_epochs=20, learning_rate=0.0005, lr_update=20, log_step=200
    )
    naaf.update(val_step=10, logg_path="./runs/runX/logs", precomp_enc_text_type="GloVe", lambda_softmax=20.0)
    naaf.update(mean_neg=0.11, stnd_neg=0.09, mean_pos=0.52, stnd_pos=0.12, thres=0.31, thres_safe=0.16)
    naaf.update(alpha=2.0, using_intra_info=False)
    return argparse.Namespace(
        **{**COMMON_OPT, **naaf, "vocab_size": len(GLOVE_SPECIALS) + len(WORDS), **changes}
    )


def official_checkpoint(opt: argparse.Namespace, seed: int = 0) -> dict:
    """``model_best.pth.tar`` as the official train.py saves it, from weights moved off their init."""
    torch.manual_seed(seed)
    image, text = official_modules(opt)
    with torch.no_grad():
        for param in [*image.parameters(), *text.parameters()]:
            param.add_(torch.randn_like(param) * 0.2)
    return {
        "epoch": 12,
        "model": [image.state_dict(), text.state_dict()],
        "best_rsum": 431.5,
        "opt": opt,
        "Eiters": 27000,
    }


def vocab_words(specials: list[str]) -> list[str]:
    return [*specials, *WORDS]


def write_json_vocab(path: Path, words: list[str], scan_style: bool = True) -> Path:
    """SCAN's serialize_vocab (word2idx, idx2word with string ids, idx) or NAAF's GloVe json."""
    word2idx = {w: i for i, w in enumerate(words)}
    if scan_style:
        payload = {
            "word2idx": word2idx,
            "idx2word": {str(i): w for i, w in enumerate(words)},
            "idx": len(words),
        }
    else:
        payload = {"word2idx": word2idx, "char_level": False, "max_len": None}
    path.write_text(json.dumps(payload))
    return path


def write_pickle_vocab(path: Path, words: list[str], monkeypatch, module: str, protocol: int) -> Path:
    """The pickled ``Vocabulary`` object of VSE++-style code (class ``vocab.Vocabulary`` or, pickled by
    ``python vocab.py``, ``__main__.Vocabulary``)."""
    cls = type("Vocabulary", (), {"__module__": module})
    if module == "__main__":
        monkeypatch.setattr(sys.modules["__main__"], "Vocabulary", cls, raising=False)
    else:
        holder = types.ModuleType(module)
        holder.Vocabulary = cls
        monkeypatch.setitem(sys.modules, module, holder)
    vocab = cls()
    vocab.word2idx = {w: i for i, w in enumerate(words)}
    vocab.idx2word = dict(enumerate(words))
    vocab.idx = len(words)
    path.write_bytes(pickle.dumps(vocab, protocol=protocol))
    return path


def captions(seed: int, n: int = 7) -> list[str]:
    """Captions of known words (plus one unknown word) that both tokenisations split alike."""
    gen = torch.Generator().manual_seed(seed)
    texts = []
    for i in range(n):
        length = 2 + int(torch.randint(0, 8, (1,), generator=gen))
        picks = torch.randint(0, len(WORDS), (length,), generator=gen).tolist()
        texts.append(" ".join([WORDS[k] for k in picks] + (["zebra"] if i == 3 else [])))
    return texts


def official_ids(texts: list[str], words: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The official data.py: ``<start>`` + vocab(token) (``<unk>`` if unknown) + ``<end>``, padded with 0."""
    index = {w: i for i, w in enumerate(words)}
    seqs = [
        [index["<start>"], *(index.get(w, index["<unk>"]) for w in t.split()), index["<end>"]] for t in texts
    ]
    lens = torch.tensor([len(s) for s in seqs])
    ids = torch.zeros(len(seqs), int(lens.max()), dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq)
    return ids, lens


def region_features(seed: int, n: int = 5) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, REGIONS, IMG_DIM, generator=gen).relu()  # BUTD pool5 features are >= 0


def nothing_written(out: Path) -> None:
    assert not out.exists()
    leftovers = list(out.parent.iterdir()) if out.parent.exists() else []
    assert not leftovers, leftovers


# ------------------------------------------------------------------------------ scores


#: NAAF's test-time score jumps where a word-region score crosses the threshold (the positive mask) or a
#: word's smoothed Row_max crosses 0 (the negative gate). The two computations differ by ~1e-7 (float32
#: encoders, measured), so the checks below keep every such quantity at least this far from its edge.
NAAF_MARGIN = 1e-5


def _naaf_threshold_and_margin(ckpt: dict, images: torch.Tensor, ids, lens) -> tuple[float, float]:
    """A thres_safe splitting the words (some below threshold for every region, some above: both branches
    count), and the distance of the official scores' discontinuities from their edges at that threshold."""
    image, text = official_encoders(ckpt)
    order = torch.argsort(lens, descending=True, stable=True)
    with torch.no_grad():
        img, emb = image(images).double(), text(ids[order], lens[order].tolist()).double()
    cap = torch.zeros_like(emb)
    cap[order] = emb
    valid = torch.arange(cap.shape[1])[None, :] < lens[:, None]  # (n_cap, L)
    s = torch.einsum("cld,vrd->vclr", cap, img)  # (n_img, n_cap, L, R)
    intra = torch.softmax((cap @ cap.transpose(1, 2) * 5).masked_fill(~valid[:, None, :], -torch.inf), dim=-1)

    def margin(thres: float) -> float:
        row_max = s.amax(-1) - thres
        gate = torch.einsum("cjl,vcl->vcj", intra, row_max.masked_fill(~valid, 0.0))
        return min(float((s - thres).abs()[:, valid].min()), float(gate.abs()[:, valid].min()))

    median = float(s.amax(-1)[:, valid].median())
    thres = max((round(median + k / 1000, 3) for k in range(-5, 6)), key=margin)
    below = (s.amax(-1)[:, valid] < thres).double().mean()
    assert 0.2 < below < 0.8  # both branches see many words
    return thres, margin(thres)


CASES = {
    # SCAN t-i LSE, the README's flags; SCAN's json vocabulary
    "scan-t2i-json": (scan_opt(), SCAN_SPECIALS, "json"),
    # SCAN i-t AVG, two GRU layers, weight-normalised fc, COCO; the pickled Vocabulary (protocol 2)
    "scan-i2t-pickle": (
        scan_opt(
            cross_attn="i2t",
            agg_func="Mean",
            lambda_softmax=4.0,
            num_layers=2,
            precomp_enc_type="weight_norm",
            data_name="coco_precomp",
        ),
        SCAN_SPECIALS,
        "pickle-vocab-2",
    ),
    # unnormalised embeddings, one GRU direction, softmax feature norm, Max; pickled by `python vocab.py`
    "scan-t2i-raw-pickle0": (
        scan_opt(
            agg_func="Max",
            raw_feature_norm="softmax",
            bi_gru=False,
            no_imgnorm=True,
            no_txtnorm=True,
            lambda_softmax=4.0,
        ),
        SCAN_SPECIALS,
        "pickle-__main__-0",
    ),
    # NAAF's default: GloVe text encoder, GloVe vocabulary (<pad> <unk> <start> <end>), learned thresholds
    "naaf-glove": (naaf_opt(alpha=2.5), GLOVE_SPECIALS, "glove-json"),
    # NAAF with the random word embedding (basic) and SCAN's vocabulary
    "naaf-basic": (naaf_opt(precomp_enc_text_type="basic"), SCAN_SPECIALS, "json"),
}


def _write_vocab(kind: str, tmp_path: Path, specials: list[str], monkeypatch) -> Path:
    words = vocab_words(specials)
    if kind == "json":
        return write_json_vocab(tmp_path / "f30k_precomp_vocab.json", words)
    if kind == "glove-json":
        return write_json_vocab(tmp_path / "f30k_precomp.json", words, scan_style=False)
    _, module, protocol = kind.split("-")
    return write_pickle_vocab(tmp_path / "vocab.pkl", words, monkeypatch, module, int(protocol))


@pytest.mark.parametrize("case", list(CASES))
def test_imported_run_scores_like_the_official_forward(case, tmp_path, monkeypatch):
    opt, specials, vocab_kind = CASES[case]
    words = vocab_words(specials)
    vocab = _write_vocab(vocab_kind, tmp_path, specials, monkeypatch)
    texts, images = captions(seed=1), region_features(seed=2)
    off_ids, off_lens = official_ids(texts, words)
    ckpt = official_checkpoint(argparse.Namespace(**vars(opt)), seed=3)
    naaf = hasattr(opt, "thres_safe")
    if naaf:
        ckpt["opt"].thres_safe, margin = _naaf_threshold_and_margin(ckpt, images, off_ids, off_lens)
        assert margin > NAAF_MARGIN
    torch.save(ckpt, tmp_path / "model_best.pth.tar")

    record = import_checkpoint(
        tmp_path / "model_best.pth.tar", tmp_path / "run", options=ImportOptions(vocab=vocab)
    )
    assert record["family"] == ("naaf" if naaf else "scan")
    run = load_run(tmp_path / "run")

    ids, lens = run.tokenize(texts)
    assert torch.equal(lens, off_lens)
    if specials == SCAN_SPECIALS:  # the official ids themselves
        assert torch.equal(ids, off_ids)
        assert run.tokenizer.word2idx == {w: i for i, w in enumerate(words)}
    expected = official_similarities(ckpt, images, off_ids, off_lens)
    with torch.no_grad():
        if naaf:  # the official evaluation scores in float64 (encode_data stores float64 arrays)
            img = run.model.encode_images(images).double()
            cap = run.model.encode_texts(ids, lens).double()
            sims = run.model.matcher(img, cap, lens).sims
            assert float(run.model.matcher.threshold_safe) == ckpt["opt"].thres_safe
            assert float(run.model.matcher.threshold) == ckpt["opt"].thres
        else:
            sims = run.model(images, ids, lens).sims
            assert sims.dtype == torch.float32
    assert sims.shape == expected.shape == (len(images), len(texts))
    assert float(expected.std()) > 1e-2  # the scores tell the pairs apart
    assert float((sims.double() - expected).abs().max()) < TOLERANCE


def test_opt_is_mapped_onto_the_run_config(tmp_path):
    opt = scan_opt(
        cross_attn="i2t", agg_func="Mean", lambda_softmax=4.0, lambda_lse=20.0, data_name="coco_precomp"
    )
    torch.save(official_checkpoint(opt), tmp_path / "ckpt.pth.tar")
    # nltk keeps punctuation and hyphenated words: the imported vocabulary splits words as nltk does
    words = [*SCAN_SPECIALS, *WORDS[:-2], ".", "white-walled"]
    vocab = write_json_vocab(tmp_path / "vocab.json", words)
    import_checkpoint(tmp_path / "ckpt.pth.tar", tmp_path / "run", options=ImportOptions(vocab=str(vocab)))
    cfg = load_run(tmp_path / "run").config
    mc = cfg.model
    assert (mc.matcher, mc.embed_dim, mc.image_encoder, mc.text_encoder) == ("scan", EMBED, "precomp", "gru")
    assert (mc.precomp.region_dim, mc.precomp.num_regions) == (IMG_DIM, 36)
    assert (mc.gru.word_dim, mc.gru.num_layers, mc.gru.bidirectional) == (WORD_DIM, 1, True)
    assert (mc.scan.direction, mc.scan.agg) == ("i2t", "mean")
    assert (mc.scan.lambda_softmax, mc.scan.lambda_lse) == (4.0, 20.0)
    assert (mc.scan.feature_norm, mc.scan.normalize_inputs) == ("clipped_l2norm", True)
    assert (cfg.data.dataset, cfg.data.tokenizer, cfg.data.test_split) == ("precomp", "word", "testall")
    assert (cfg.eval.split, cfg.eval.coco_1k) == ("testall", True)
    record = json.loads((tmp_path / "run" / IMPORT_FILE).read_text())
    assert record["family"] == "scan" and record["ignored"] == {}
    assert record["metadata"]["epoch"] == 12 and record["metadata"]["best_rsum"] == 431.5
    assert record["metadata"]["vocab_ids"] == "as the official vocabulary"
    assert record["metadata"]["vocab_words_never_tokenized"] == 0
    run = load_run(tmp_path / "run")
    assert run.tokenizer.split == "treebank"
    ids, lens = run.tokenize([f"{WORDS[0]} white-walled {WORDS[1]}."])
    assert ids[0, : int(lens[0])].tolist() == [
        words.index(w) for w in ("<start>", WORDS[0], "white-walled", WORDS[1], ".", "<end>")
    ]
    training_only = set(record["metadata"]["training_only_opt"])
    assert {"margin", "max_violation", "learning_rate", "lr_update", "data_path"} <= training_only
    assert record["opt"]["cross_attn"] == "i2t"


def test_the_checkpoints_built_here_have_the_official_parameter_names():
    """``EncoderImagePrecomp`` / ``EncoderImageWeightNormPrecomp`` (``fc``), ``EncoderText`` (``embed``,
    ``rnn``) and NAAF's ``GloveRNNEncoder`` (``embed.glove``), reference notes 1.1-1.2."""
    gru = {
        f"rnn.{k}_l0{d}" for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh") for d in ("", "_reverse")
    }
    scan = official_checkpoint(scan_opt())
    assert set(scan) == {"model", "opt", "epoch", "best_rsum", "Eiters"}
    assert set(scan["model"][0]) == {"fc.weight", "fc.bias"}
    assert set(scan["model"][1]) == {"embed.weight", *gru}
    assert set(official_checkpoint(naaf_opt())["model"][1]) == {"embed.glove.weight", *gru}
    weight_norm = official_checkpoint(scan_opt(precomp_enc_type="weight_norm"))["model"][0]
    assert set(weight_norm) == {"fc.weight_g", "fc.weight_v", "fc.bias"}


# ------------------------------------------------------------------------------ bad inputs


@pytest.fixture
def scan_files(tmp_path):
    ckpt = tmp_path / "model_best.pth.tar"
    torch.save(official_checkpoint(scan_opt()), ckpt)
    return (
        ckpt,
        write_json_vocab(tmp_path / "vocab.json", vocab_words(SCAN_SPECIALS)),
        tmp_path / "runs" / "imported",
    )


@pytest.mark.parametrize(
    "override", ["data.max_caption_len=40", "data.region_boxes=true", "data.tokenizer=bert"]
)
def test_import_refuses_data_overrides_that_contradict_a_scan_checkpoint(scan_files, override):
    """f715cbc accepted them: a SCAN model fed truncated captions, boxed regions or BERT ids."""
    ckpt, vocab, out = scan_files
    with pytest.raises(ConfigError) as caught:
        import_checkpoint(ckpt, out, options=ImportOptions(vocab=str(vocab), overrides=[override]))
    assert caught.value.key == override.split("=", 1)[0] and "contradicts the scan checkpoint" in str(
        caught.value
    )
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_a_seps_checkpoint_given_family_scan_is_refused(tmp_path):
    seps = {
        "model": {
            "img_enc.visual_encoder.embeddings.cls_token": torch.zeros(1, 1, 8),
            "txt_enc.bert.embeddings.word_embeddings.weight": torch.zeros(30, 8),
            "sparse_net.score_predictor.0.weight": torch.zeros(4, 8),
        },
        "opt": argparse.Namespace(sparse_ratio=0.5, aggr_ratio=0.4, embed_size=512, vit_type="vit"),
        "epoch": 3,
    }
    torch.save(seps, tmp_path / "model_best.pth")
    out = tmp_path / "runs" / "imported"
    vocab = write_json_vocab(tmp_path / "vocab.json", vocab_words(SCAN_SPECIALS))
    with pytest.raises(DataError, match="model_best.pth is not a scan checkpoint"):
        import_checkpoint(
            tmp_path / "model_best.pth", out, family_name="scan", options=ImportOptions(vocab=str(vocab))
        )
    nothing_written(out)


def test_a_naaf_checkpoint_given_family_scan_is_refused(tmp_path):
    torch.save(official_checkpoint(naaf_opt()), tmp_path / "naaf.pth.tar")
    vocab = write_json_vocab(tmp_path / "vocab.json", vocab_words(GLOVE_SPECIALS), scan_style=False)
    out = tmp_path / "runs" / "imported"
    with pytest.raises(DataError, match=r"naaf.pth.tar is not a scan checkpoint \(it looks like naaf\)"):
        import_checkpoint(
            tmp_path / "naaf.pth.tar", out, family_name="scan", options=ImportOptions(vocab=str(vocab))
        )
    nothing_written(out)


def test_a_vocabulary_of_another_size_is_refused(scan_files, tmp_path):
    ckpt, _, out = scan_files
    vocab = write_json_vocab(tmp_path / "coco_precomp_vocab.json", vocab_words(SCAN_SPECIALS) + ["extra"])
    expected = r"coco_precomp_vocab.json has 31 words .*embedding \(model\[1\] embed.weight\) has 30 rows"
    with pytest.raises(DataError, match=expected):
        import_checkpoint(ckpt, out, options=ImportOptions(vocab=str(vocab)))
    nothing_written(out)


def test_a_vocabulary_pickle_naming_another_class_is_refused_and_nothing_runs(scan_files, tmp_path):
    ckpt, _, out = scan_files
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.makedirs, (str(marker),))

    (tmp_path / "vocab.pkl").write_bytes(pickle.dumps(Payload(), protocol=2))
    with pytest.raises(
        DataError, match=r"vocab.pkl: refused to unpickle \(class os.makedirs is not allowed\)"
    ):
        import_checkpoint(ckpt, out, options=ImportOptions(vocab=str(tmp_path / "vocab.pkl")))
    assert not marker.exists()
    nothing_written(out)


def test_a_checkpoint_pickle_naming_another_class_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.makedirs, (str(marker),))

    ckpt = official_checkpoint(scan_opt())
    ckpt["opt"] = Payload()
    torch.save(ckpt, tmp_path / "evil.pth.tar")
    vocab = write_json_vocab(tmp_path / "vocab.json", vocab_words(SCAN_SPECIALS))
    out = tmp_path / "runs" / "imported"
    with pytest.raises(DataError, match=r"evil.pth.tar: refused to unpickle .*os.makedirs"):
        import_checkpoint(tmp_path / "evil.pth.tar", out, options=ImportOptions(vocab=str(vocab)))
    assert not marker.exists()
    nothing_written(out)


def test_a_truncated_checkpoint_is_refused(scan_files, tmp_path):
    ckpt, vocab, out = scan_files
    data = ckpt.read_bytes()
    (tmp_path / "cut.pth.tar").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="cut.pth.tar: not a readable checkpoint: the archive is truncated"):
        import_checkpoint(tmp_path / "cut.pth.tar", out, options=ImportOptions(vocab=str(vocab)))
    nothing_written(out)


@pytest.mark.parametrize(
    "change, key",
    [
        ({"agg_func": "Median"}, "opt.agg_func"),
        ({"raw_feature_norm": "l1norm"}, "opt.raw_feature_norm"),
        ({"cross_attn": "both"}, "opt.cross_attn"),
        ({"precomp_enc_type": "backbone"}, "opt.precomp_enc_type"),
        ({"no_imgnorm": True}, "opt.no_imgnorm"),
        ({"lambda_softmax": 0.0}, "opt.lambda_softmax"),
    ],
)
def test_an_opt_value_patchword_cannot_map_is_one_error_naming_it(change, key, tmp_path):
    torch.save(official_checkpoint(scan_opt(**change)), tmp_path / "ckpt.pth.tar")
    vocab = write_json_vocab(tmp_path / "vocab.json", vocab_words(SCAN_SPECIALS))
    out = tmp_path / "runs" / "imported"
    with pytest.raises(ConfigError) as err:
        import_checkpoint(tmp_path / "ckpt.pth.tar", out, options=ImportOptions(vocab=str(vocab)))
    assert err.value.key == key
    nothing_written(out)


def test_the_vocabulary_is_required(scan_files):
    ckpt, _, out = scan_files
    with pytest.raises(ConfigError) as err:
        import_checkpoint(ckpt, out)
    assert err.value.key == "--vocab"
    nothing_written(out)


# ------------------------------------------------------------------------------ command line


def test_cli_import(scan_files, capsys):
    from patchword.cli import main

    ckpt, vocab, out = scan_files
    assert main(["import", str(ckpt), "--out", str(out), "--vocab", str(vocab)]) == 0
    assert json.loads((out / IMPORT_FILE).read_text())["family"] == "scan"
    printed = capsys.readouterr()
    # stdout is one JSON document (| jq); the file written is said on stderr
    assert json.loads(printed.out)["family"] == "scan" and f"written: {out}" in printed.err


def test_naaf_buffers_built_from_opt_are_not_counted_as_loaded_tensors(tmp_path, capsys):
    """Defect: import.json's ``"loaded"`` (the card's "N tensors loaded") counted NAAF's 8 matcher
    buffers built from opt (thresholds, fit statistics, zero counters) as tensors of the checkpoint."""
    from patchword.cli import main

    ckpt = official_checkpoint(naaf_opt())
    torch.save(ckpt, tmp_path / "naaf.pth.tar")
    vocab = write_json_vocab(tmp_path / "f30k_precomp.json", vocab_words(GLOVE_SPECIALS), scan_style=False)
    out = tmp_path / "run"
    assert main(["import", str(tmp_path / "naaf.pth.tar"), "--out", str(out), "--vocab", str(vocab)]) == 0
    record = json.loads((out / IMPORT_FILE).read_text())
    tensors = sum(len(state) for state in ckpt["model"])  # img_enc's and txt_enc's
    printed = json.loads(capsys.readouterr().out)
    assert record["loaded"] == tensors == printed["loaded"] and printed["derived"] == 8
    assert sorted(record["derived"]) == [
        f"matcher.{name}"
        for name in sorted(
            (
                "threshold",
                "threshold_safe",
                "mean_pos",
                "std_pos",
                "mean_neg",
                "std_neg",
                "num_samples",
                "num_fits",
            )
        )
    ]
    assert record["loaded"] + len(record["derived"]) == len(load_run(out).model.state_dict())
    assert main(["export", str(out), str(tmp_path / "export")]) == 0
    card = (tmp_path / "export" / "README.md").read_text()
    assert f"{tensors} tensors loaded, " in card and ", 8 built from its options" in card
