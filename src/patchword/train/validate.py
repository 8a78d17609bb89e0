"""Checks a run passes before it writes anything: the config on its own, then the model against the data.

:func:`check_config` needs nothing but the config (value ranges, combinations, files that must exist,
device availability); :func:`check_model_data` runs once the tokenizer, the model and the data are built
(image size, text lengths and vocabulary against what the encoders accept). Every failure is a
:class:`~patchword.errors.ConfigError` naming the key to change.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from patchword._validation import check_at_least, check_finite_number
from patchword.config import check_common_values, override_keys
from patchword.data.config import PATH_KEYS, require_path
from patchword.data.prepare import (
    REGION_DATASETS,
    SYNTHETIC_DATASETS,
    eval_role,
    reads_dense_text,
)
from patchword.device import resolve_device
from patchword.errors import ConfigError, PatchwordError
from patchword.fileio import check_output_dir
from patchword.model import model_reads_dense, resolve_plugin_options
from patchword.runs.checks import (
    check_eval_settings,
    check_model_data,
    check_pretrained_sources,
    check_region_boxes,
    data_image_size,
)
from patchword.runs.config import CUDA_GRAPH_COMPILE_MODES, RunConfig, resolve_new_run
from patchword.runs.evaluate import held_out_warning
from patchword.train.matcher_checks import check_matcher
from patchword.train.settings import check_optimiser, check_settings_take_effect
from patchword.train.trackers import TRACKERS, import_wandb

if TYPE_CHECKING:
    from patchword.eval.coco_extended import CocoGroundTruth

__all__ = [
    "check_config",
    "check_config_and_truth",
    "check_launch",
    "check_model_data",
    "data_image_size",
    "refuse_moved_data",
    "RESUMABLE_KEYS",
]

_logger = logging.getLogger(__name__)

#: Keys a ``--resume`` may change: how long to train, how often to log, validate and save, where to run,
#: and how to evaluate. Everything else (data, model, optimiser, seed) is the run's own and stays.
RESUMABLE_KEYS = frozenset(
    {
        "train.epochs",
        "train.max_steps",
        "train.time_budget_s",
        "train.log_every",
        "train.eval_every",
        "train.checkpoint_every",
        "train.num_threads",
        "eval.split",
        "eval.batch_size",
        "eval.coco_1k",
        "eval.max_memory_mb",
        "eval.precision",
        "eval.coco_extended",
        "device",
        "progress",
        "data.cache_dir",
        "data.num_workers",
        "train.pair_chunk",
        "train.compile",
        "train.compile_scope",
        "train.compile_mode",
        "train.text_width_multiple",
        "train.report_to",
        "train.wandb_project",
        "train.wandb_mode",
        "dist_timeout_s",
    }
)


def _check_compile(cfg: RunConfig, resuming: bool) -> None:
    tc = cfg.train
    # A scope or mode set without compiling would be silently ignored. Not checked on resume: the saved
    # run compiled with them, and turning train.compile off to continue elsewhere leaves them moot.
    if not tc.compile and not resuming:
        for key, value, default in (
            ("compile_scope", tc.compile_scope, "modules"),
            ("compile_mode", tc.compile_mode, "default"),
        ):
            if value != default:
                raise ConfigError(
                    f"train.{key}",
                    f"{value} has no effect without train.compile=true (set that, or train.{key}={default})",
                )
    if tc.compile_mode in CUDA_GRAPH_COMPILE_MODES and tc.compile_scope != "step":
        # A CUDA graph's replay writes its outputs where the previous replay left its own: evaluation,
        # which encodes every batch before scoring, would find earlier batches overwritten.
        raise ConfigError(
            "train.compile_mode",
            f"{tc.compile_mode} replays CUDA graphs, whose outputs the next replay overwrites; evaluation "
            "keeps the compiled encoders' outputs across batches: set train.compile_scope=step (the "
            "training loss alone is compiled)",
        )


def _check_wandb(mode: str) -> None:
    """W&B installed, and for ``online`` an API key (environment, ``~/.netrc`` or W&B's settings): without
    one ``wandb.init`` fails after the run directory was written."""
    wandb = import_wandb()
    if mode == "online" and not wandb.login(prompt=False, verify=False):
        raise ConfigError(
            "train.wandb_mode",
            "online needs a W&B API key: run `wandb login` or set WANDB_API_KEY, or log offline "
            "(train.wandb_mode=offline, the default) and `wandb sync` later",
        )


def _check_identity(cfg: RunConfig) -> None:
    """The run's name (its directory under ``output_dir``, never empty), its seed, and no NaN anywhere."""
    if not cfg.name.strip():
        raise ConfigError("name", "is the run's directory under output_dir: a plain non-empty name, got ''")
    check_common_values(cfg)


def _check_cache_dir(cfg: RunConfig) -> None:
    """The synthetic scenes' cache (``data.cache_dir``; default ``$PATCHWORD_CACHE`` or ``~/.cache``) can
    take them, unless they are cached there already (a read-only shared cache is read, never written)."""
    from patchword.data.synthetic.dataset import cache_target

    target = cache_target(cfg.data.synthetic_config(), cfg.data.cache_dir or None)
    if not (target / "config.json").is_file():
        check_output_dir(target.parent, "data.cache_dir", what="the directory synthetic scenes are cached in")


def check_config(cfg: RunConfig, *, resuming: bool = False) -> torch.device:
    """Check everything that can be checked from the config alone; return the resolved device. A new run's
    config is first completed as its config.yaml records it, in ``cfg`` (:func:`resolve_new_run`: an empty
    ``data.bert_vocab`` set to ``model.hf_text``, ``data.size_augment`` to what training does, every local
    path absolute).

    ``resuming``: the run continues from its checkpoint, so what only initialises a model
    (``train.init_from``, ``model.tiny_pretrained`` and its vocabulary: the run saved its own) need not
    exist any more.

    Raises:
        ConfigError: naming the first offending key.
        MissingFileError: a configured file or directory does not exist.
    """
    return check_config_and_truth(cfg, resuming=resuming)[0]


def check_config_and_truth(
    cfg: RunConfig, *, resuming: bool = False, source: Path | None = None
) -> tuple[torch.device, CocoGroundTruth | None]:
    """:func:`check_config`, also returning the COCO ground truth its check of ``eval.coco_extended``
    read (None without it): a training run scores with it (``evaluate_run(ground_truth=...)``) rather
    than read the files a second time. ``source``: the config.yaml a resumed run's values come from (the
    messages about its files name it)."""
    # a new run's empty data.bert_vocab is model.hf_text's from here on, its paths absolute (config.yaml)
    vocab_from_hf_text = not resuming and resolve_new_run(cfg)
    where = None if source is None else str(source)
    device = resolve_device(cfg.device)
    dc, mc, tc, ec = cfg.data, cfg.model, cfg.train, cfg.eval
    from patchword.matching import list_matchers

    if mc.matcher not in list_matchers():
        raise ConfigError("model.matcher", f"must be one of {', '.join(list_matchers())}, got {mc.matcher!r}")
    bf16 = cfg.precision in ("amp_bf16", "bf16")
    if bf16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            "precision", f"{cfg.precision} needs a GPU with bfloat16 support; use amp_fp16 or fp32"
        )
    if cfg.precision == "fp64" and device.type == "mps":
        raise ConfigError("precision", "fp64 is not supported on mps (no float64 kernels); use fp32 or cpu")
    # its ranges, precision and COCO extras, as `patchword eval` checks them; the split sizes the COCO
    # protocols need are checked once the data is read (check_model_data -> check_eval_split)
    ground_truth = check_eval_settings(cfg, device)
    # ranges
    for key, value, low in [
        ("train.batch_size", tc.batch_size, 2),
        ("train.epochs", tc.epochs, 1),
        ("train.max_steps", tc.max_steps, 0),
        ("train.time_budget_s", tc.time_budget_s, 0),
        ("train.global_warmup_steps", tc.global_warmup_steps, 0),
        ("train.log_every", tc.log_every, 0),
        ("train.eval_every", tc.eval_every, 0),
        ("train.eval_max_images", tc.eval_max_images, 0),
        ("train.checkpoint_every", tc.checkpoint_every, 0),
        ("train.num_threads", tc.num_threads, 0),
        ("train.grad_clip", tc.grad_clip, 0),
        ("train.pair_chunk", tc.pair_chunk, 0),
        ("train.text_width_multiple", tc.text_width_multiple, 0),
        ("data.num_workers", dc.num_workers, 0),
        ("data.max_caption_len", dc.max_caption_len, 3),
        ("data.max_dense_len", dc.max_dense_len, 3),
        ("data.dev_from_train", dc.dev_from_train, 0),
        ("data.image_size", dc.image_size, 1),
        ("model.embed_dim", mc.embed_dim, 1),
    ]:
        check_at_least(key, value, low)
    eval_role(dc, ec.split)  # "test" or "dev" (or the dataset's names for them)
    check_finite_number("train.lr", tc.lr, inclusive=False)
    check_optimiser(cfg, resuming=resuming)
    _check_identity(cfg)
    check_finite_number("dist_timeout_s", cfg.dist_timeout_s, inclusive=False)
    check_matcher(cfg, resuming=resuming)
    if not resuming:  # a new run's config.yaml holds every option of a plug-in matcher, a default too
        resolve_plugin_options(cfg.model)
    _check_compile(cfg, resuming)
    if not resuming:  # a resumed run keeps what it trained with (and cannot change it)
        check_settings_take_effect(cfg)
    unknown = [name for name in tc.report_to if name not in TRACKERS]
    if unknown:
        raise ConfigError("train.report_to", f"unknown tracker {unknown[0]!r}; known: {', '.join(TRACKERS)}")
    repeated = [name for i, name in enumerate(tc.report_to) if name in tc.report_to[:i]]
    if repeated:  # two trackers of one kind would log every record twice
        raise ConfigError("train.report_to", f"names {repeated[0]!r} twice")
    if "wandb" in tc.report_to:
        _check_wandb(tc.wandb_mode)
    if dc.dataset in SYNTHETIC_DATASETS:
        for key in ("num_train", "num_dev", "num_test"):
            check_at_least(f"data.{key}", getattr(dc, key), 1)
    # combinations
    region_data = dc.dataset in REGION_DATASETS
    if region_data != (mc.image_encoder == "precomp"):
        if region_data:
            raise ConfigError(
                "model.image_encoder",
                f"data.dataset={dc.dataset} holds region features: set model.image_encoder=precomp",
            )
        raise ConfigError(
            "model.image_encoder",
            f"model.image_encoder=precomp needs region features: data.dataset in {REGION_DATASETS}",
        )
    check_region_boxes(cfg)
    if mc.text_encoder in ("tiny", "gru") and dc.tokenizer != "word":
        raise ConfigError("data.tokenizer", f"model.text_encoder={mc.text_encoder} embeds word ids: use word")
    if mc.text_encoder == "bert" and dc.tokenizer != "bert":
        raise ConfigError("data.tokenizer", "model.text_encoder=bert reads WordPiece ids: use bert")
    if dc.size_augment and dc.tokenizer != "bert":
        raise ConfigError(
            "data.size_augment", "is the BERT caption augmentation ([MASK] tokens): set data.tokenizer=bert"
        )
    if mc.image_encoder == "tiny" and not region_data and mc.tiny_vit.image_size != data_image_size(cfg):
        key = "data.synthetic_image_size" if dc.dataset in SYNTHETIC_DATASETS else "data.image_size"
        raise ConfigError(
            key,
            f"is {data_image_size(cfg)} but model.tiny_vit.image_size is {mc.tiny_vit.image_size}",
        )
    matcher_reads_dense = model_reads_dense(mc)
    reads_dense = reads_dense_text(dc, matcher_reads_dense)
    if matcher_reads_dense and dc.dense and region_data:  # said once, here, not by each rank's data reader
        _logger.warning(
            "data.dataset=%s holds region features, no dense text: the matcher, which reads dense text, "
            "runs without any (its records say dense_pairing null); set data.dense=false to say so",
            dc.dataset,
        )
    if mc.text_encoder == "tiny":
        lengths = [("data.max_caption_len", dc.max_caption_len)]
        if reads_dense:
            lengths.append(("data.max_dense_len", dc.max_dense_len))
        for key, length in lengths:
            if length > mc.max_text_len:
                raise ConfigError(key, f"is {length} but model.max_text_len is {mc.max_text_len}")
    if dc.dataset in SYNTHETIC_DATASETS:  # a file or /proc there: now, not after the scenes are generated
        _check_cache_dir(cfg)
    # files that must exist
    dc.require_files(("train", "dev", "test"), source=where)
    if not resuming:
        # a data.* key the dataset never reads, set by the user now; not on --resume: a config.yaml an older
        # version wrote with such a key must still resume
        dc.refuse_unread_settings()
        _check_initialisation(cfg)
        check_pretrained_sources(cfg, vocab_from_hf_text=vocab_from_hf_text)  # before the data is read
        _check_one_vocabulary(cfg, vocab_from_hf_text)
    if mc.gru.glove_path:
        require_path(mc.gru.glove_path, "model.gru.glove_path", source=where)
    reuse = held_out_warning(dc)  # allowed (a quick check on two splits), but never silently
    if reuse:
        _logger.warning(reuse)
    return device, ground_truth


def _check_initialisation(cfg: RunConfig) -> None:
    """What a new run starts from: a vocabulary file, pretrained tiny encoders (with their vocabulary),
    a warm-start checkpoint."""
    from patchword.pretrained import VOCAB, resolve_pretrained_dir, resolve_vocab_path

    dc, mc = cfg.data, cfg.model
    if dc.vocab_path:
        require_path(resolve_vocab_path(dc.vocab_path), "data.vocab_path")
        if dc.tokenizer == "word":  # a damaged file fails now (naming it), not after the data is loaded
            from patchword.data.tokenizers import WordVocab

            dc.check_word_split(WordVocab.load(resolve_vocab_path(dc.vocab_path)).split)
    if mc.tiny_pretrained:
        vocab = (resolve_pretrained_dir(mc.tiny_pretrained) / VOCAB).resolve()
        given = Path(resolve_vocab_path(dc.vocab_path)).resolve() if dc.vocab_path else None
        if dc.tokenizer != "word" or given != vocab:
            raise ConfigError(
                "data.vocab_path",
                f"must be the pretrained encoders' vocabulary: set data.vocab_path={mc.tiny_pretrained}",
            )
    if cfg.train.init_from:
        require_path(cfg.train.init_from, "train.init_from", "path")


def refuse_moved_data(overrides: Iterable[str], saved: RunConfig, config_path: Path) -> None:
    """Refuse an override of a data path (:data:`~patchword.data.config.PATH_KEYS`) on ``--resume``, as any
    key the run keeps, saying where the run reads its data: a relative path (a run made before config.yaml
    recorded them absolute) is read from the working directory, so the way out is to run from there.

    Raises:
        ConfigError: naming the first such key.
    """
    for key in override_keys(overrides):
        name = key.removeprefix("data.")
        if key.startswith("data.") and name in PATH_KEYS and key not in RESUMABLE_KEYS:
            value = getattr(saved.data, name)
            if not value:  # the run reads no such path (synthetic scenes): the generic refusal says why
                continue
            relative = not Path(value).expanduser().is_absolute()
            where = "; it is relative: resume from the directory the run was created in" if relative else ""
            raise ConfigError(
                key,
                f"cannot change on --resume: the run reads its data from {value!r}, as "
                f"{config_path} records it{where}",
            )


def _check_one_vocabulary(cfg: RunConfig, vocab_from_hf_text: bool) -> None:
    """A ``data.bert_vocab`` given beside a BERT text encoder is its own vocabulary (``model.hf_text``'s) or
    a part of it (every id both have is the same token, as in one cut to the ids the encoder embeds), with
    the same casing: another token at some id would feed the embedding of one word for another. A backbone
    without a vocabulary of its own has none to compare.

    Raises:
        ConfigError: naming ``data.bert_vocab``, ``model.hf_text`` and the first id they differ at.
    """
    from patchword.data.tokenizers import BertCaptionTokenizer

    dc, mc = cfg.data, cfg.model
    if not dc.tokenizer == mc.text_encoder == "bert" or vocab_from_hf_text or dc.bert_vocab == mc.hf_text:
        return
    try:
        own = BertCaptionTokenizer.from_pretrained(mc.hf_text, local_files_only=mc.hf_local_files_only)
    except (PatchwordError, OSError, ValueError):  # no vocabulary beside the weights: none to compare
        return
    given = BertCaptionTokenizer.from_pretrained(dc.bert_vocab, local_files_only=mc.hf_local_files_only)
    ids, own_ids = ({i: t for t, i in tok.vocab.items()} for tok in (given, own))
    differ = [i for i in sorted(ids.keys() & own_ids.keys()) if ids[i] != own_ids[i]]
    if differ or given.do_lower_case != own.do_lower_case:
        what = (
            f"id {differ[0]} is {ids[differ[0]]!r} there, {own_ids[differ[0]]!r} in model.hf_text's"
            if differ
            else (f"do_lower_case {given.do_lower_case} there, {own.do_lower_case} in model.hf_text's")
        )
        raise ConfigError(
            "data.bert_vocab",
            f"{dc.bert_vocab!r} is another vocabulary than model.hf_text's ({mc.hf_text!r}): {what}; a run "
            "tokenises with its text encoder's vocabulary: leave data.bert_vocab out",
        )


def check_launch(cfg: RunConfig, world_size: int) -> None:
    """Check the config against the number of processes of a ``torchrun`` launch.

    Raises:
        ConfigError: a global batch that does not split evenly over the processes; the whole training
            loss compiled (``train.compile_scope=step``) under several processes.
    """
    if world_size > 1 and cfg.train.compile and cfg.train.compile_scope == "step":
        raise ConfigError(
            "train.compile_scope",
            "step compiles the loss module, whose gathers across processes have not been tested compiled: "
            "under torchrun use train.compile_scope=modules",
        )
    if cfg.train.batch_size % world_size:
        raise ConfigError(
            "train.batch_size",
            f"{cfg.train.batch_size} captions do not split over {world_size} processes: the global batch "
            f"must be a multiple of the world size (torchrun --nproc_per_node x --nnodes)",
        )
