"""Run configuration: the dataclasses behind ``patchword train --config run.yaml key.path=value``."""

from __future__ import annotations

from dataclasses import dataclass, field

from patchword.model import ModelConfig

__all__ = ["DataConfig", "TrainConfig", "EvalConfig", "RunConfig"]


@dataclass
class DataConfig:
    """Where the data comes from and how text is tokenised."""

    # synthetic | laps (LAPS/SEPS layout) | karpathy (dataset_*.json) | precomp (SCAN region features:
    # {split}_ims.npy + {split}_caps.txt) | synthetic_regions (the synthetic scenes as region features)
    dataset: str = "synthetic"
    root: str = ""  # laps: dir of {split}_ids.txt, _caps.txt; karpathy: dataset_*.json; precomp: npy dir
    image_root: str = ""  # directory holding the image files (real datasets)
    dense_train: str = ""  # laps: dense-caption jsonl of the train split (image order)
    dense_dev: str = ""  # laps: dense-caption jsonl of the dev split
    dense_test: str = ""  # laps: dense-caption jsonl of the test split
    train_split: str = "train"  # split names as the dataset spells them
    dev_split: str = "dev"
    test_split: str = "test"
    dense: bool = True  # feed dense (MLLM) captions to the matcher
    tokenizer: str = "word"  # word (vocabulary built from the training text) | bert
    bert_vocab: str = "bert-base-uncased"  # local dir / vocab file / hub id when tokenizer == bert
    max_caption_len: int = 40  # tokens, specials included; the same in training and evaluation
    max_dense_len: int = 128  # tokens of a dense caption, specials included
    image_size: int = 224  # real datasets: input resolution
    cache_dir: str = ""  # synthetic data cache ("" = $PATCHWORD_CACHE or ~/.cache/patchword)
    synthetic_seed: int = 0  # synthetic scenes: generator seed
    synthetic_image_size: int = 64  # synthetic scenes: image side in pixels
    num_train: int = 10000  # synthetic scenes: training images (5 captions each)
    num_dev: int = 1000  # synthetic scenes: dev images
    num_test: int = 1000  # synthetic scenes: test images
    dense_omit_prob: float = 0.15  # synthetic dense captions: probability an object is left out
    dense_wrong_attr_prob: float = 0.1  # synthetic dense captions: probability of a wrong attribute
    vocab_path: str = ""  # tokenizer=word: a SCAN-format vocabulary json to use ("" = build from train text)
    vocab_min_count: int = 1  # tokenizer=word: keep words seen this often in training text (SCAN: 4)
    mmap: bool = True  # precomp: memory-map {split}_ims.npy instead of loading it
    num_regions: int = 36  # synthetic_regions: regions per image
    region_dim: int = 256  # synthetic_regions: feature width
    boxes_per_object: int = 3  # synthetic_regions: regions per object
    region_noise: float = 0.3  # synthetic_regions: norm of the noise added to every region


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


@dataclass
class EvalConfig:
    """Evaluation after training (and ``patchword eval``)."""

    split: str = "test"  # which split to report
    batch_size: int = 128  # images / texts per encoder batch
    coco_1k: bool = False  # also report the COCO 1K five-fold protocol (5K test)
    max_memory_mb: int = 1024  # working-memory budget of the scoring engine (block sizes follow it)


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
    device: str = "cpu"  # cpu | cuda | cuda:1 | mps ...
    precision: str = "fp32"  # fp32 | amp_bf16 | amp_fp16
    progress: bool | None = None  # progress bars (None = only on a terminal)
