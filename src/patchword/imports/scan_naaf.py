"""Importer of the official SCAN (kuanghuei/SCAN) and NAAF (CrossmodalGroup/NAAF) checkpoints.

Both save ``model_best.pth.tar`` = ``{"model": [img_enc.state_dict(), txt_enc.state_dict()], "opt":
argparse.Namespace, "epoch", "best_rsum", "Eiters"}`` (reference/naaf_scan_vse.md 1.1-1.2). The families:

* ``scan``: ``opt`` has ``cross_attn`` (t2i or i2t); ``model.matcher=scan``.
* ``naaf``: ``opt`` has ``thres_safe``; ``model.matcher=naaf``. NAAF keeps its learned thresholds in the
  mutable ``opt`` it pickles (``thres``, ``thres_safe``, and the last fit's ``mean_pos`` / ``stnd_pos`` /
  ``mean_neg`` / ``stnd_neg``); they become the matcher's float64 buffers.

Tensors (official -> patchword): ``model[0]`` ``fc.weight`` / ``fc.bias`` -> ``image_encoder.proj.*``
(``weight_norm``: ``fc.weight_g`` and ``fc.weight_v`` folded into ``proj.weight = g * v / ||v||``);
``model[1]`` ``embed.weight`` (NAAF GloVe: ``embed.glove.weight``) -> ``text_encoder.embed.weight`` (rows
reordered when the vocabulary's specials are not patchword's first four ids), ``rnn.*`` ->
``text_encoder.rnn.*``. Any other tensor is an error naming it.

The vocabulary is not in the checkpoint: ``--vocab`` names it, as SCAN's json (``word2idx``, ``idx2word``,
``idx``), NAAF's GloVe json (``word2idx`` only; ``<pad> <unk> <start> <end>`` = 0..3) or the pickled
``Vocabulary`` object of VSE++-style code, read by an unpickler that builds nothing but a plain holder.

``opt`` fields mapped (model and evaluation): ``embed_size`` -> model.embed_dim; ``img_dim`` ->
model.precomp.region_dim; ``precomp_enc_type`` (basic | weight_norm); ``word_dim``, ``num_layers`` ->
model.gru.*; ``bi_gru`` (SCAN; NAAF is always bidirectional) -> model.gru.bidirectional;
``precomp_enc_text_type`` (NAAF: basic | GloVe; GloVe forces the word normalisation on); ``no_imgnorm`` /
``no_txtnorm`` -> model.{scan,naaf}.normalize_inputs (both or neither); ``vocab_size`` (checked against
the embedding and the vocabulary); SCAN ``cross_attn``, ``agg_func``, ``lambda_softmax``, ``lambda_lse``,
``raw_feature_norm`` -> model.scan.*; NAAF ``lambda_softmax``, ``alpha`` -> model.naaf.*, ``thres``,
``thres_safe``, ``mean_pos``, ``stnd_pos``, ``mean_neg``, ``stnd_neg`` -> the matcher's buffers
(``using_intra_info`` has no effect: the test-time score forces it on, training never reads it);
``data_name`` -> data.root (``data/<data_name>``), and for ``coco_precomp`` data.test_split=testall with
eval.coco_1k=true.

Not in ``opt`` and set to the official data: 36 regions per image (model.precomp.num_regions); captions are
never truncated (data.max_caption_len = model.max_text_len).

Training-only ``opt`` fields (recorded in import.json, not mapped: patchword's trainer has its own
optimisation settings): ``margin``, ``max_violation``, ``num_epochs``, ``batch_size``, ``learning_rate``,
``lr_update``, ``grad_clip``, ``workers``, ``log_step``, ``val_step``, ``resume``; and paths of the
training machine: ``data_path``, ``vocab_path``, ``logger_name``, ``logg_path``, ``model_name``.

Any other ``opt`` field is refused naming it (a fork's option can change the score, and the import would
present the fork as plain SCAN / NAAF), except the process bookkeeping of the SEPS / VSE-infinity lineage
(``seed``, ``gpu``, distributed launch fields), which is recorded and warned about. import.json records the
dataset ``data_name`` names (``f30k`` / ``coco``) for the published-results comparison.

Over 400 lines: two families that share the official vocabulary readers and opt mapping.
"""

from __future__ import annotations

import io
import json
import logging
import math
import pickle
from functools import partial
from pathlib import Path
from typing import Any

import torch

from patchword.config import from_dict
from patchword.data.tokenizers.word import WordVocab, tokenize
from patchword.errors import ConfigError, DataError
from patchword.imports.base import ImportOptions, ImportPlan, check_opt_names, opt_dict, register_family
from patchword.readers import describe_content, require_file
from patchword.runs.config import RunConfig

__all__ = ["read_official_vocab", "VOCAB_CLASSES"]

_logger = logging.getLogger(__name__)

# Training-only opt fields (recorded in import.json as metadata.training_only_opt, never mapped).
_OPTIMISATION = (
    "margin",
    "max_violation",
    "num_epochs",
    "batch_size",
    "learning_rate",
    "lr_update",
    "grad_clip",
)
_RUNTIME = ("workers", "log_step", "val_step", "resume")
_PATHS = ("data_path", "vocab_path", "logger_name", "logg_path", "model_name")  # of the training machine
_TRAINING_ONLY = (*_OPTIMISATION, *_RUNTIME, *_PATHS)
_COMMON = ("embed_size", "img_dim", "precomp_enc_type", "word_dim", "num_layers", "no_imgnorm", "no_txtnorm")
_NAAF_STATE = ("thres", "thres_safe", "mean_pos", "stnd_pos", "mean_neg", "stnd_neg")
_SCAN_ONLY = ("bi_gru", "cross_attn", "agg_func", "lambda_softmax", "lambda_lse", "raw_feature_norm")
_NAAF_ONLY = ("precomp_enc_text_type", "lambda_softmax", "alpha", "using_intra_info", *_NAAF_STATE)
_MAPPED = {"scan": (*_COMMON, *_SCAN_ONLY), "naaf": (*_COMMON, *_NAAF_ONLY)}
_OTHER_KNOWN = ("vocab_size", "data_name")
#: Fields neither official train.py has, named as the process and logging bookkeeping of the official
#: SEPS / LAPS / VSE-infinity arguments.py (seed, GPU choice, distributed launch): a fork that adds them
#: still computes what SCAN / NAAF compute from a saved checkpoint, so they are recorded and warned about.
#: Any other unknown field is refused: a fork's option (``focal_type``, ``measure``, ``position_embed``...)
#: can change the score, and an import must not present such a model as plain SCAN / NAAF.
_BOOKKEEPING = frozenset(
    {
        "seed", "gpu", "gpu_id", "multi_gpu", "distributed", "world_size", "rank", "local_rank",
        "dist_backend", "dist_url",
    }
)  # fmt: skip
#: ``opt.data_name`` -> the dataset recorded in import.json (the README's two; another: None)
_DATASETS = {"f30k_precomp": "f30k", "coco_precomp": "coco"}
_METADATA_KEYS = ("epoch", "best_rsum", "Eiters")

_AGG = {"LogSumExp": "logsumexp", "Mean": "mean", "Max": "max", "Sum": "sum"}
_FEATURE_NORMS = ("clipped_l2norm", "l2norm", "softmax", "clipped", "no_norm")
_SPECIALS = ("<pad>", "<start>", "<end>", "<unk>")  # patchword's WordVocab ids 0..3

#: The classes a pickled vocabulary may name: the ``Vocabulary`` of the official ``vocab.py`` (pickled by
#: that module, or by ``python vocab.py`` as ``__main__``), and what protocols 0/1 use to rebuild an object.
VOCAB_CLASSES = {("vocab", "Vocabulary"), ("__main__", "Vocabulary")}


# ----------------------------------------------------------------------------------------- vocabulary


class _VocabularyHolder:
    """What a pickled ``Vocabulary`` becomes: its attributes (``word2idx``, ``idx2word``, ``idx``) only."""


class _Refused(pickle.UnpicklingError):
    """A pickle naming what a vocabulary may not (told apart from bytes that are no pickle at all)."""


def _rebuild(cls: type, base: type, state: Any) -> _VocabularyHolder:
    """``copyreg._reconstructor`` restricted to the holder (pickle protocols 0 and 1)."""
    if cls is not _VocabularyHolder or base is not object or state is not None:
        raise _Refused("copyreg._reconstructor is allowed for the Vocabulary only")
    return _VocabularyHolder()


class _VocabUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in VOCAB_CLASSES:
            return _VocabularyHolder
        if (module, name) in {("copy_reg", "_reconstructor"), ("copyreg", "_reconstructor")}:
            return _rebuild
        if (module, name) in {("__builtin__", "object"), ("builtins", "object")}:
            return object
        raise _Refused(f"class {module}.{name} is not allowed")


def _not_a_vocabulary(path: Path, raw: bytes) -> DataError:
    """The error of a ``--vocab`` file that is neither a json object nor a pickle (a json list, a text file
    of words, binary data)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        found = "binary data that is neither UTF-8 text nor a pickle"
    else:
        try:
            found = f"a json {type(json.loads(text)).__name__}"  # a list, a str: not an object
        except ValueError:
            found = describe_content(path)
    return DataError(
        f"--vocab {path} is not a word2idx vocabulary (a json object or a pickle of a dict or Vocabulary): "
        f"it is {found}"
    )


def _vocab_mapping(raw: bytes, path: Path) -> dict[str, Any]:
    """The vocabulary file's attributes: a json object, or a pickled ``Vocabulary``'s ``__dict__``."""
    if raw.lstrip()[:1] == b"{":
        try:
            payload = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DataError(f"vocabulary {path} is not valid json: {err}") from None
        return payload
    if not raw.strip():
        raise _not_a_vocabulary(path, raw)
    try:
        obj = _VocabUnpickler(io.BytesIO(raw), encoding="utf-8").load()
    except _Refused as err:
        raise DataError(
            f"vocabulary {path}: refused to unpickle ({err}); a pickled vocabulary may name only "
            f"{', '.join(sorted(f'{m}.{n}' for m, n in VOCAB_CLASSES))}"
        ) from None
    except pickle.UnpicklingError:  # no pickle at all ("invalid load key", "stack underflow")
        raise _not_a_vocabulary(path, raw) from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, UnicodeDecodeError) as err:
        raise DataError(f"vocabulary {path} is neither json nor a readable pickle ({err})") from None
    if isinstance(obj, _VocabularyHolder):
        return dict(vars(obj))
    if isinstance(obj, dict):
        return obj
    raise DataError(f"vocabulary {path}: expected a Vocabulary or a mapping, got {type(obj).__name__}")


def read_official_vocab(path: str | Path) -> list[str]:
    """The words of an official vocabulary file, by official id (``words[i]`` has id i).

    Raises:
        MissingFileError: no such file.
        DataError: not a vocabulary (the message names the file and what is wrong), or a pickle naming a
            class outside :data:`VOCAB_CLASSES`.
    """
    path = Path(path)
    require_file(path, "--vocab", hint="--vocab names the official vocabulary file (json or pkl)")
    payload = _vocab_mapping(path.read_bytes(), path)
    word2idx = payload.get("word2idx")
    if not isinstance(word2idx, dict) or not word2idx:
        raise DataError(f"vocabulary {path} has no word2idx mapping")
    words: dict[int, str] = {}
    for word, idx in word2idx.items():
        if not isinstance(word, str) or isinstance(idx, bool) or not isinstance(idx, int):
            raise DataError(f"vocabulary {path}: word2idx entry {word!r}: {idx!r} is not word -> integer id")
        if idx in words:
            raise DataError(f"vocabulary {path}: id {idx} is given to {words[idx]!r} and {word!r}")
        words[idx] = word
    if sorted(words) != list(range(len(words))):
        raise DataError(f"vocabulary {path}: the ids are not 0..{len(words) - 1}")
    idx2word = payload.get("idx2word")
    if isinstance(idx2word, dict):  # SCAN's json spells the ids as strings
        for idx, word in idx2word.items():
            try:
                agrees = words.get(int(idx)) == word
            except (TypeError, ValueError):
                agrees = False
            if not agrees:
                raise DataError(f"vocabulary {path}: idx2word[{idx!r}] = {word!r} disagrees with word2idx")
    missing = [s for s in _SPECIALS if s not in word2idx]
    if missing:
        raise DataError(f"vocabulary {path} lacks the special token(s) {', '.join(missing)}")
    return [words[i] for i in range(len(words))]


def _word_vocab(official: list[str]):
    """patchword's WordVocab of the same words, and the official id of every patchword id (its row order)."""
    # captions cut as the official nltk.word_tokenize cuts them, so every vocabulary word can occur
    vocab = WordVocab((w for w in official if w not in _SPECIALS), split="treebank")
    index = {w: i for i, w in enumerate(official)}
    return vocab, [index[w] for w in vocab.idx2word]


# ----------------------------------------------------------------------------------------- checkpoint


def _states(ckpt: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    model = ckpt.get("model")
    if not isinstance(model, (list, tuple)) or len(model) != 2:
        return None
    img, txt = model
    if not isinstance(img, dict) or not isinstance(txt, dict):
        return None
    if not ({"fc.weight", "fc.weight_v"} & set(img)) or "rnn.weight_ih_l0" not in txt:
        return None
    return img, txt


def _opt_or_none(ckpt: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return opt_dict(ckpt)
    except DataError:
        return None


def _detect_scan(ckpt: dict[str, Any]) -> bool:
    opt = _opt_or_none(ckpt)
    return _states(ckpt) is not None and opt is not None and "cross_attn" in opt and "thres_safe" not in opt


def _detect_naaf(ckpt: dict[str, Any]) -> bool:
    opt = _opt_or_none(ckpt)
    return _states(ckpt) is not None and opt is not None and "thres_safe" in opt


class _Opt:
    """Typed reads of the official ``opt`` (a missing key is a DataError, a bad value a ConfigError)."""

    def __init__(self, opt: dict[str, Any], path: Path) -> None:
        self.opt, self.path = opt, path

    def get(self, key: str) -> Any:
        if key not in self.opt:
            raise DataError(
                f"{self.path}: the checkpoint's opt has no {key!r} (the official train.py sets it)"
            )
        return self.opt[key]

    def int(self, key: str, minimum: int = 1) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"opt.{key}", f"expected an integer >= {minimum}, got {value!r}")
        return value

    def float(self, key: str, positive: bool = False) -> float:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"opt.{key}", f"expected a finite number, got {value!r}")
        if positive and value <= 0:
            raise ConfigError(f"opt.{key}", f"must be > 0, got {value!r}")
        return float(value)

    def bool(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            raise ConfigError(f"opt.{key}", f"expected true or false, got {value!r}")
        return value

    def choice(self, key: str, allowed: tuple[str, ...], why: str = "") -> str:
        value = self.get(key)
        if value not in allowed:
            raise ConfigError(
                f"opt.{key}", f"{value!r} is not supported{why} (supported: {', '.join(allowed)})"
            )
        return value


def _image_weight(img: dict[str, Any], path: Path) -> tuple[torch.Tensor, dict[str, str]]:
    """``fc.weight``, or the folded ``weight_norm(dim=None)`` weight ``g * v / ||v||``; and what it used."""
    if "fc.weight" in img:
        return img["fc.weight"], {"fc.weight": "image_encoder.proj.weight"}
    g, v = img.get("fc.weight_g"), img.get("fc.weight_v")
    if not isinstance(g, torch.Tensor) or not isinstance(v, torch.Tensor) or g.numel() != 1:
        raise DataError(
            f"{path}: model[0] needs fc.weight_g (one value, weight_norm dim=None) and fc.weight_v"
        )
    weight = (v.double() * (g.double().reshape(()) / v.double().norm())).to(v.dtype)
    return weight, {"fc.weight_g": "image_encoder.proj.weight", "fc.weight_v": "image_encoder.proj.weight"}


def _gru_keys(num_layers: int, bidirectional: bool) -> list[str]:
    suffixes = ("", "_reverse") if bidirectional else ("",)
    return [
        f"rnn.{kind}_l{layer}{suffix}"
        for layer in range(num_layers)
        for suffix in suffixes
        for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    ]


def _check_keys(state: dict[str, Any], expected: set[str], where: str, path: Path) -> None:
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        what = [f"missing {missing}"] if missing else []
        what += [f"unexpected {unexpected}"] if unexpected else []
        raise DataError(f"{path}: {where} does not match its opt: {'; '.join(what)}")
    for key in state:
        if not isinstance(state[key], torch.Tensor):
            raise DataError(f"{path}: {where}[{key!r}] is not a tensor")


def _model_section(family: str, o: _Opt) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``model`` section the opt implies, and the encoder facts the tensor mapping needs."""
    embed = o.int("embed_size")
    o.choice("precomp_enc_type", ("basic", "weight_norm"))
    glove = family == "naaf" and o.choice("precomp_enc_text_type", ("basic", "GloVe")) == "GloVe"
    bidirectional = True if family == "naaf" else o.bool("bi_gru")
    img_norm = not o.bool("no_imgnorm")
    txt_norm = True if glove else not o.bool("no_txtnorm")  # GloveRNNEncoder is built with no_txtnorm=False
    if img_norm != txt_norm:
        key = "no_imgnorm" if not img_norm else "no_txtnorm"
        raise ConfigError(
            f"opt.{key}", "patchword normalises both modalities or neither (model.*.normalize_inputs)"
        )
    gru = {"word_dim": o.int("word_dim"), "num_layers": o.int("num_layers"), "bidirectional": bidirectional}
    section: dict[str, Any] = {
        "matcher": family,
        "embed_dim": embed,
        "image_encoder": "precomp",
        "text_encoder": "gru",
        "precomp": {"region_dim": o.int("img_dim"), "num_regions": 36},
        "gru": gru,
    }
    if family == "scan":
        section["scan"] = {
            "direction": o.choice("cross_attn", ("t2i", "i2t")),
            "agg": _AGG[o.choice("agg_func", tuple(_AGG))],
            "lambda_softmax": o.float("lambda_softmax", positive=True),
            "lambda_lse": o.float("lambda_lse", positive=True),
            "feature_norm": o.choice(
                "raw_feature_norm", _FEATURE_NORMS, " (the official func_attention fails on the l1 norms)"
            ),
            "normalize_inputs": img_norm,
        }
    else:
        o.bool("using_intra_info")  # recorded only: the official test-time score sets it to True itself
        section["naaf"] = {
            "lambda_softmax": o.float("lambda_softmax", positive=True),
            "alpha": o.float("alpha", positive=True),
            "intra_temperature": 5.0,
            "intra_relation": "test",
            "min_samples": 200,
            "blend": 0.7,
            "reset_below_min": True,
            "normalize_inputs": img_norm,
        }
    return section, {"glove": glove, "gru": gru}


def _naaf_buffers(o: _Opt) -> dict[str, torch.Tensor]:
    """The matcher's float64 buffers from NAAF's opt: its learned thresholds and last fit's statistics."""
    f64 = torch.float64
    values = {k: o.float(k) for k in _NAAF_STATE}
    # opt keeps the argparse defaults (0) until the first fit; patchword's "never fitted" is NaN.
    fitted = values["stnd_pos"] != 0 or values["stnd_neg"] != 0
    names = ("mean_pos", "std_pos", "mean_neg", "std_neg")
    stat = {
        n: torch.tensor(values[k] if fitted else math.nan, dtype=f64)
        for n, k in zip(names, _NAAF_STATE[2:], strict=True)
    }
    return {
        "matcher.threshold": torch.tensor(values["thres"], dtype=f64),
        "matcher.threshold_safe": torch.tensor(values["thres_safe"], dtype=f64),
        **{f"matcher.{name}": value for name, value in stat.items()},
        "matcher.num_samples": torch.tensor(0.0, dtype=f64),
        "matcher.num_fits": torch.tensor(0.0, dtype=f64),
    }


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return repr(value)


def _check_opt_fields(family: str, opt: dict[str, Any], path: Path) -> list[str]:
    """The opt fields neither official train.py has and that are bookkeeping only (:data:`_BOOKKEEPING`),
    after refusing any other unknown field: patchword maps the official options only, and a field it does
    not know may change what the model computes (a fork's attention focus, similarity measure, position
    embedding), so the checkpoint would be scored as something it is not.

    Raises:
        DataError: a field not named by a string.
        ConfigError: unknown fields (the key is the first; the message names them all).
    """
    check_opt_names(opt, path)
    known = {*_MAPPED[family], *_TRAINING_ONLY, *_OTHER_KNOWN}
    unknown = sorted(k for k in opt if k not in known and k not in _BOOKKEEPING)
    if unknown:
        official = "kuanghuei/SCAN" if family == "scan" else "CrossmodalGroup/NAAF"
        raise ConfigError(
            f"opt.{unknown[0]}",
            f"not an option of the official {official} train.py (unknown opt field(s): "
            f"{', '.join(unknown)}): a fork's option may change what the model computes, and patchword "
            f"maps the official {family.upper()} options only, so it does not import the checkpoint",
        )
    return sorted(k for k in opt if k in _BOOKKEEPING and k not in known)


def _convert(family: str, ckpt: dict[str, Any], options: ImportOptions, path: Path) -> ImportPlan:
    opt = opt_dict(ckpt, str(path))
    bookkeeping = _check_opt_fields(family, opt, path)
    o = _Opt(opt, path)
    states = _states(ckpt)
    if states is None:
        raise DataError(f"{path}: 'model' is not the official [img_enc state, txt_enc state] pair")
    img, txt = states
    section, facts = _model_section(family, o)

    # Tensors: every official key is mapped, or the checkpoint does not match its opt (an error naming it).
    weight, img_map = _image_weight(img, path)
    _check_keys(img, {*img_map, "fc.bias"}, "model[0] (img_enc)", path)
    embed_key = "embed.glove.weight" if facts["glove"] else "embed.weight"
    gru = facts["gru"]
    rnn_keys = _gru_keys(gru["num_layers"], gru["bidirectional"])
    _check_keys(txt, {embed_key, *rnn_keys}, "model[1] (txt_enc)", path)

    # Vocabulary: patchword's ids, and the official id of each (the embedding's row order).
    if not options.vocab:
        raise ConfigError("--vocab", f"a {family} checkpoint needs its word vocabulary file (json or pkl)")
    official_words = read_official_vocab(options.vocab)
    rows = txt[embed_key].shape[0]
    if len(official_words) != rows:
        raise DataError(
            f"vocabulary {options.vocab} has {len(official_words)} words but the checkpoint's word embedding "
            f"(model[1] {embed_key}) has {rows} rows: not the vocabulary this model was trained with"
        )
    vocab_size = o.int("vocab_size")
    if vocab_size != rows:
        raise DataError(f"{path}: opt.vocab_size is {vocab_size} but model[1] {embed_key} has {rows} rows")
    vocab, official_ids = _word_vocab(official_words)
    same_ids = official_ids == list(range(rows))

    state: dict[str, torch.Tensor] = {
        "image_encoder.proj.weight": weight,
        "image_encoder.proj.bias": img["fc.bias"],
        "text_encoder.embed.weight": txt[embed_key][torch.tensor(official_ids)],
        **{f"text_encoder.{key}": txt[key] for key in rnn_keys},
    }
    derived: dict[str, str] = {}
    if family == "naaf":
        buffers = _naaf_buffers(o)
        state.update(buffers)
        derived = dict.fromkeys(buffers, "NAAF matcher buffer built from opt (no tensor of the checkpoint)")

    data_name = opt.get("data_name", "")
    if not isinstance(data_name, str):  # it names the data directory: a list would become "data/['...']"
        raise ConfigError("opt.data_name", f"expected a dataset name such as f30k_precomp, got {data_name!r}")
    coco = data_name == "coco_precomp"
    config = from_dict(
        RunConfig,
        {
            "data": {
                "dataset": "precomp",
                "root": f"data/{data_name}" if data_name else "",
                "test_split": "testall" if coco else "test",
                "tokenizer": "word",
                # the rule the saved vocab.json tokenises with (nltk's Treebank words, as the official
                # loader splits), not the default alnum: the config says what the run reads
                "word_split": vocab.split,
                "vocab_min_count": 4,
                "max_caption_len": 256,
                "dense": False,
            },
            "model": {**section, "max_text_len": 256},
            "eval": {"split": "testall" if coco else "test", "coco_1k": coco},
        },
    )

    if bookkeeping:
        _logger.warning(
            "%s: opt fields the official %s code does not have, bookkeeping only (not read): %s",
            path,
            family,
            bookkeeping,
        )
    unreachable = [w for w in vocab.idx2word[len(_SPECIALS) :] if tokenize(w, vocab.split) != [w]]
    if unreachable:
        _logger.warning(
            "%s: %d vocabulary words (e.g. %s) are never produced by nltk's Treebank tokenizer on their own",
            options.vocab,
            len(unreachable),
            ", ".join(repr(w) for w in unreachable[:5]),
        )
    metadata: dict[str, Any] = {k: _plain(ckpt[k]) for k in _METADATA_KEYS if k in ckpt}
    metadata.update(
        {
            "vocab": str(Path(options.vocab).resolve()),  # absolute, as import.json's source
            "vocab_ids": "as the official vocabulary"
            if same_ids
            else "renumbered: <pad> <start> <end> <unk> first, the embedding rows reordered to match",
            "vocab_words_never_tokenized": len(unreachable),
            "training_only_opt": sorted(k for k in opt if k in _TRAINING_ONLY),
            "unrecognised_opt": bookkeeping,
        }
    )
    if derived:
        _logger.info(
            "%s: %d matcher buffers built from opt, not loaded: %s", path, len(derived), sorted(derived)
        )
    if family == "naaf":
        metadata["naaf_buffers"] = (
            "threshold, threshold_safe and the fit statistics from opt; num_samples, num_fits 0"
        )
    ignored = {
        str(key): "not part of the official checkpoint layout; not read"
        for key in ckpt
        if key not in ("model", "opt", *_METADATA_KEYS)
    }
    return ImportPlan(
        family,
        config,
        state,
        ignored,
        opt,
        tokenizer=vocab,
        metadata=metadata,
        dataset=_DATASETS.get(data_name),
        derived=derived,
    )


#: The data keys the checkpoint decides: the --vocab word tokens (untruncated, as the official loader
#: feeds them), no dense text, region features without boxes. An import override may not change them.
_DETERMINED = ("data.tokenizer", "data.max_caption_len", "data.dense", "data.region_boxes")

register_family(
    "scan",
    "kuanghuei/SCAN model_best.pth.tar, t2i or i2t; needs --vocab",
    _detect_scan,
    partial(_convert, "scan"),
    reads=("vocab",),
    determines=_DETERMINED,
)
register_family(
    "naaf",
    "CrossmodalGroup/NAAF model_best.pth.tar with its learned thresholds; needs --vocab",
    _detect_naaf,
    partial(_convert, "naaf"),
    reads=("vocab",),
    determines=_DETERMINED,
)
