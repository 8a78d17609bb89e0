"""Run configuration: the dataclasses behind ``patchword train --config run.yaml key.path=value``, and the
run recipes shipped with patchword (``patchword/configs/*.yaml``: ``--config demo`` names one)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from patchword.data.config import DataConfig
from patchword.eval.config import EvalConfig
from patchword.model import ModelConfig
from patchword.precision import Precision

__all__ = [
    "CUDA_GRAPH_COMPILE_MODES",
    "DataConfig",
    "TrainConfig",
    "EvalConfig",
    "RunConfig",
    "NOT_EVALUATION_KEYS",
    "not_evaluation_reason",
    "list_recipes",
    "recipe_path",
    "load_run_config",
    "resolve_new_run",
    "resolve_run_paths",
]


#: ``train.compile_mode``: torch.compile's modes ("default" passes none)
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
#: the ``train.compile_mode`` values under which torch.compile replays the compiled step as CUDA graphs
CUDA_GRAPH_COMPILE_MODES = ("reduce-overhead", "max-autotune")


@dataclass
class TrainConfig:
    """Optimisation; defaults follow the official SEPS/LAPS recipe (reference/seps_laps.md 1.3)."""

    epochs: int = 30  # passes over the training captions
    max_steps: int = 0  # stop after this many optimiser steps (0 = no limit)
    time_budget_s: float = 0.0  # stop training after this many seconds (0 = no limit)
    batch_size: int = 128  # captions (with their images) per step
    lr: float = 2e-4  # AdamW learning rate of heads, projections and from-scratch encoders
    backbone_lr_mult: float = 0.1  # pretrained backbones train at lr * this
    weight_decay: float = 1e-4  # AdamW weight decay, every group
    lr_milestones: list[int] = field(default_factory=lambda: [9, 15, 20, 25])  # epochs where lr *= lr_decay
    lr_decay: float = 0.3  # multiplicative lr decay at each milestone
    lr_milestone_steps: list[int] = field(default_factory=list)  # also decay after these optimiser steps
    margin: float = 0.2  # hinge margin
    loss: Literal["hinge", "infonce"] = "hinge"  # alignment loss: VSE++ hinge on the matcher's sims, or
    # CLIP's symmetric InfoNCE with the matcher's learned temperature (model.matcher=clip, pretraining)
    hardest_after_epochs: int = 1  # sum over negatives before this epoch, hardest negative from it on
    align_warmup_epochs: int = 1  # the alignment loss ramps 0 -> 1 linearly over these epochs
    global_warmup_steps: int = 0  # first steps train only the global embeddings (cheap warm start)
    init_from: str = ""  # warm start: load matching model weights from this checkpoint (best.pt, last.pt,
    # export dir or model.safetensors) before training; the optimizer starts fresh
    grad_clip: float = 2.0  # max global gradient norm (0 = off)
    ratio_weight: float = 2.0  # weight of the selection ratio loss
    mask_false_negatives: bool = True  # ignore negatives the dataset says fit the caption (synthetic)
    eval_every: int = 0  # validate on dev every N steps (0 = only at epoch ends)
    eval_max_images: int = 0  # validate on the first N dev images only (0 = all)
    log_every: int = 50  # log the training loss every N steps
    num_threads: int = 0  # torch CPU threads (0 = torch's default)
    checkpoint_every: int = 1000  # also write last.pt every N optimiser steps (0 = only after validation);
    # SIGTERM / SIGINT write it too before the run stops
    pair_chunk: int = 0  # seps/laps: score the captions in blocks of N with activations recomputed in the
    # backward pass (bounds the step's B x B memory; same gradients, ~1/3 more matcher compute; 0 = off)
    compile: bool = False  # torch.compile the training step (GPU; the first steps compile)
    compile_scope: Literal["modules", "step"] = "modules"  # train.compile: the encoders and the matcher
    # one by one (evaluation runs them compiled too, except under precision=bf16), or the whole training
    # loss in one graph (encoders, matcher and loss: fusion across them; evaluation runs the plain modules)
    # torch.compile's mode; reduce-overhead and max-autotune replay the step as CUDA graphs
    # (compile_scope=step only: a replay overwrites the previous one's outputs)
    compile_mode: CompileMode = "default"
    text_width_multiple: int = 0  # pad each batch's caption and dense-caption ids to a multiple of this
    # many positions (at most data.max_caption_len / max_dense_len): fewer distinct batch shapes, each of
    # which a CUDA-graph step records once; 0 = 16 when the step replays CUDA graphs, else 1 (the longest)
    report_to: list[str] = field(default_factory=list)  # experiment trackers: tensorboard, wandb (none: [])
    wandb_project: str = "patchword"  # report_to=wandb: the W&B project
    wandb_mode: Literal["offline", "online"] = "offline"  # report_to=wandb: offline keeps it on this machine

    def width_multiple(self) -> int:
        """``text_width_multiple`` with 0 resolved: 16 when the compiled step replays CUDA graphs (one
        recorded per batch shape; PyTorch calls more than 8 too many and advises padding to a few shapes),
        else 1 (each batch as wide as its longest caption)."""
        if self.text_width_multiple:
            return self.text_width_multiple
        return 16 if self.compile and self.compile_mode in CUDA_GRAPH_COMPILE_MODES else 1


@dataclass
class RunConfig:
    """Everything a run needs; saved as config.yaml in the run directory."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output_dir: str = "runs"  # parent of run directories
    name: str = "run"  # run directory name under output_dir
    seed: int = 0  # seeds torch, numpy and python
    device: str = "auto"  # auto (CUDA when available, else CPU) | cpu | cuda | cuda:1 | mps
    # fp32 | amp_bf16 / amp_fp16 (fp32 weights, autocast) | bf16 (the step in bfloat16 on a copy, fp32 master
    # weights) | fp64 (float64 weights and ops: numerical checks)
    precision: Precision = "fp32"
    progress: bool | None = None  # progress bars (None = only on a terminal)
    dist_timeout_s: float = 600.0  # torchrun: seconds a process waits for the others in a collective
    # before the launch fails (a process that died or hangs ends the run with an error, never a hang)


def list_recipes() -> list[str]:
    """Names of the run recipes shipped in ``patchword/configs`` (``demo``, ``synthetic_seps_paper``...)."""
    return sorted(
        p.name[: -len(".yaml")]
        for p in resources.files("patchword.configs").iterdir()
        if p.name.endswith(".yaml")
    )


def recipe_path(value: str | os.PathLike[str]) -> Path:
    """A YAML file: ``value`` itself when it exists, else for a bare name (``demo``, ``demo.yaml``: no
    directory) the shipped recipe of that name. A path with a directory is that file or nothing: a typo in
    the folder must not read the shipped recipe of the same file name.

    Raises:
        MissingFileError: neither (the message lists the shipped recipes).
    """
    from patchword.readers import require_file

    path = Path(value).expanduser()
    name = path.name[: -len(".yaml")] if path.name.endswith(".yaml") else path.name
    recipes = list_recipes()
    if not path.is_file() and not os.path.dirname(value) and name in recipes:
        return Path(str(resources.files("patchword.configs") / f"{name}.yaml"))
    shipped = f" (--config {name}, without a directory, reads the shipped one)" if name in recipes else ""
    require_file(path, "config file", hint=f"the shipped recipes are {', '.join(recipes)}{shipped}")
    return path


def load_run_config(
    config: str | os.PathLike[str] | None = None, overrides: list[str] | None = None
) -> RunConfig:
    """Defaults, then the recipe ``config`` (a file or a shipped name), then dotted ``overrides``; every
    local path absolute (:func:`resolve_run_paths`): a relative one is relative to the working directory
    of the command that names it."""
    from patchword.config import load_config

    cfg = load_config(RunConfig, recipe_path(config) if config else None, list(overrides or []))
    return resolve_run_paths(cfg)


def resolve_run_paths(cfg: RunConfig) -> RunConfig:
    """``cfg``, changed in place, with every local path absolute against the working directory
    (:func:`~patchword.data.config.absolute_path`): the ``data`` section's
    (:meth:`~patchword.data.config.DataConfig.absolute_paths`), and where they name a local file or
    directory (:func:`~patchword.data.config.local_path`: not a hub id or a shipped name, and a path that
    does not exist is named as typed) ``model.hf_vision`` / ``model.hf_text`` / ``model.tiny_pretrained``,
    ``model.gru.glove_path`` and ``train.init_from``. A new run records them so
    (config.yaml), and every comparison of a planned config with a saved one resolves both alike; a config
    so resolved is left as it is."""
    from patchword.data.config import local_path
    from patchword.pretrained import shipped_pretrained

    mc = cfg.model
    cfg.data = cfg.data.absolute_paths()
    mc.hf_vision, mc.hf_text = local_path(mc.hf_vision), local_path(mc.hf_text)
    mc.tiny_pretrained = local_path(mc.tiny_pretrained, shipped_pretrained())
    mc.gru.glove_path, cfg.train.init_from = local_path(mc.gru.glove_path), local_path(cfg.train.init_from)
    return cfg


def resolve_new_run(cfg: RunConfig) -> bool:
    """Complete ``cfg`` in place as a new run's config.yaml records it: an empty ``data.bert_vocab`` set to
    the text backbone's (:func:`~patchword.runs.checks.resolve_bert_vocab`), an unset
    ``data.size_augment`` of the BERT tokenizer to true (what training does), every local path absolute
    (:func:`resolve_run_paths`). Returns whether ``data.bert_vocab`` was empty. Done again to a config so
    completed, it changes nothing: a planned config and a saved one are compared so completed."""
    from patchword.runs.checks import resolve_bert_vocab  # cycle: runs.checks imports RunConfig from here

    vocab_from_hf_text = resolve_bert_vocab(cfg)
    if cfg.data.size_augment is None and cfg.data.tokenizer == "bert":
        cfg.data.size_augment = True  # train.feed: on with BERT unless set
    resolve_run_paths(cfg)
    return vocab_from_hf_text


#: The override keys (a section, or one key) that no evaluation reads, with what they change instead:
#: each is refused, naming it, rather than applied in memory and ignored (by ``patchword eval`` and by
#: ``patchword import``, whose run is only ever evaluated or trained from afresh). An architecture key
#: (``model.embed_dim``) is refused by the checkpoint, whose weights it must fit.
NOT_EVALUATION_KEYS = {
    "train": "it changes training",
    "output_dir": "it places a new run; an evaluation reads the run directory it is given",
    "name": "it names a new run; an evaluation reads the run directory it is given",
    "seed": "it seeds training",
    "model.tiny_pretrained": "it initialises training; the weights come from the checkpoint",
    "data.vocab_path": "it sets a training vocabulary; the run's own vocab.json is used",
    "data.vocab_min_count": "it sets a training vocabulary; the run's own vocab.json is used",
    "data.word_split": "the run's vocab.json records its word split",
    "data.size_augment": "it augments training captions",
    "data.num_workers": "it sets the workers decoding training batches",
}


#: ``precision`` values no evaluation reads (refused as an override, naming ``eval.precision``): evaluation
#: runs no autocast (``amp_*``), and a ``bf16`` run's checkpoints hold the fp32 master weights it scores.
#: ``fp64`` is read: the weights are loaded, the encoders run and the matcher scores in float64 (the
#: record's ``model_dtype``).
UNREAD_PRECISIONS = ("amp_bf16", "amp_fp16", "bf16")


def not_evaluation_reason(key: str, value: Any = None) -> str | None:
    """What dotted ``key`` (set to ``value``) changes instead when :data:`NOT_EVALUATION_KEYS` holds it or
    a section above it (``train.max_steps``: "it changes training"), or why ``precision`` of
    :data:`UNREAD_PRECISIONS` is never read; None for a key and value evaluations read."""
    for refused, why in NOT_EVALUATION_KEYS.items():
        if key == refused or key.startswith(refused + "."):
            return why
    if key == "precision" and value in UNREAD_PRECISIONS:
        return (
            f"precision={value}: evaluation runs no autocast, its weights in float32 (a bf16 run's fp32 "
            "master weights); eval.precision chooses the scoring's matrix products (fp32, or tf32 on CUDA); "
            "precision=fp64 runs the encoders in float64"
        )
    return None
