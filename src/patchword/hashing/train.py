"""Training and evaluation of UCMFH hashing runs: config, data, trainer, evaluation.

A run directory holds ``config.yaml`` (the resolved :class:`HashRunConfig`, what ``--config`` reads back),
``metrics.jsonl`` (one record per epoch, then the final evaluation), ``last.pt`` (atomic, everything to
resume; written every ``train.save_every`` epochs and at the end), ``model.safetensors`` + ``config.json``
(weights-only export) and ``eval.json``.

Training follows the official hash stage (task 1): ``L = w_f * L_con(f_I, f_T) + w_h * L_con(h_I, h_T)``
with ``w_f = 1``, ``w_h = 0.5``, Adam (betas 0.5, 0.999), lr 1e-4 for the encoder and 1e-3 for the hash
heads, batch 128 with ``drop_last``. Deliberate differences: the whole training set is used (official:
the first 4,992 pairs), runs are seeded, the learning rate is constant (the official MultiStepLR with
gamma 1.2 stepped per iteration *raises* the head lr x1.44 within 3 epochs, which looks unintended), and
the test split is evaluated once at the end, never used to select a checkpoint (SPEC decision 4).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from patchword.config import save_config
from patchword.hashing.data import (
    HashDataset,
    load_mat,
    load_pairs,
    load_split_dir,
    split_dataset,
    synthetic_dataset,
)
from patchword.hashing.metrics import retrieval_report
from patchword.hashing.model import UCMFH
from patchword.losses import BalancedInfoNCE, HashNetLoss, InfoNCE
from patchword.train.checkpoint import (
    atomic_save,
    export_weights,
    load_checkpoint,
    rng_state,
    seed_everything,
    set_rng_state,
)

__all__ = [
    "HashDataConfig",
    "HashModelConfig",
    "HashTrainConfig",
    "HashEvalConfig",
    "HashRunConfig",
    "LOSSES",
    "build_dataset",
    "build_model",
    "HashTrainer",
    "evaluate_model",
    "train_hashing",
    "load_run",
]

_logger = logging.getLogger(__name__)

#: ``train.loss`` choices: the contrastive loss used on both the features and the codes, or HashNet on codes.
LOSSES = ("infonce", "balanced", "infonce_i2t", "hashnet")


@dataclass
class HashDataConfig:
    """Where the features come from.

    ``format``: ``synthetic`` (labelled synthetic set), ``pairs`` (``image`` / ``text`` ``.npy`` files,
    optional ``labels``; split with ``num_query`` / ``num_train``), ``splits`` (``root`` directory of
    ``train/query/retrieval`` ``.npz`` or ``.pkl``) or ``mat`` (``root`` is a ``.mat`` file).
    """

    format: str = "synthetic"
    root: str = ""
    image: str = ""
    text: str = ""
    labels: str = ""
    num_query: int = 500
    num_train: int = 2000
    split_seed: int = 0
    synthetic_num_retrieval: int = 4000
    synthetic_seed: int = 0
    synthetic_image_dim: int = 512
    synthetic_text_dim: int = 512


@dataclass
class HashModelConfig:
    """:class:`~patchword.hashing.model.UCMFH` arguments (official values by default)."""

    bits: int = 64
    fusion: str = "unimodal"
    nhead: int = 4
    num_layers: int = 2
    dim_feedforward: int = 2048
    dropout: float = 0.1
    hidden: int = 4096
    head_dropout: float = 0.3
    eval_batch_size: int = 128


@dataclass
class HashTrainConfig:
    """Optimisation (official UCMFH values by default)."""

    epochs: int = 50
    batch_size: int = 128
    drop_last: bool = True
    optimizer: str = "adam"
    lr_encoder: float = 1e-4
    lr_heads: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.5, 0.999])
    weight_decay: float = 0.0
    loss: str = "infonce"
    temperature: float = 0.5
    feature_weight: float = 1.0
    hash_weight: float = 0.5
    hashnet_alpha: float = 0.0
    seed: int = 2023
    num_threads: int = 0
    save_every: int = 10


@dataclass
class HashEvalConfig:
    """Evaluation: mAP@``topk``, precision / recall at ``ks``; ``map_all`` adds mAP over the full ranking."""

    topk: int = 50
    ks: list[int] = field(default_factory=lambda: [1, 5, 10, 50])
    map_all: bool = False


@dataclass
class HashRunConfig:
    """Everything a ``patchword hash train`` run needs."""

    data: HashDataConfig = field(default_factory=HashDataConfig)
    model: HashModelConfig = field(default_factory=HashModelConfig)
    train: HashTrainConfig = field(default_factory=HashTrainConfig)
    eval: HashEvalConfig = field(default_factory=HashEvalConfig)
    output_dir: str = "runs/hash"
    name: str = ""
    device: str = "cpu"


# ------------------------------------------------------------------------------------------ builders


def build_dataset(dc: HashDataConfig) -> HashDataset:
    """The :class:`HashDataset` described by ``dc``."""
    if dc.format == "synthetic":
        return synthetic_dataset(
            num_train=dc.num_train,
            num_query=dc.num_query,
            num_retrieval=dc.synthetic_num_retrieval,
            seed=dc.synthetic_seed,
            image_dim=dc.synthetic_image_dim,
            text_dim=dc.synthetic_text_dim,
        )
    if dc.format == "pairs":
        if not dc.image or not dc.text:
            raise ValueError("data.format=pairs needs data.image and data.text (.npy files)")
        full = load_pairs(dc.image, dc.text, dc.labels or None)
        return split_dataset(full, num_query=dc.num_query, num_train=dc.num_train, seed=dc.split_seed)
    if dc.format == "splits":
        return load_split_dir(dc.root)
    if dc.format == "mat":
        return load_mat(dc.root, num_query=dc.num_query, num_train=dc.num_train, seed=dc.split_seed)
    raise ValueError(f"data.format must be synthetic, pairs, splits or mat, got {dc.format!r}")


def build_model(mc: HashModelConfig, image_dim: int, text_dim: int) -> UCMFH:
    return UCMFH(
        image_dim,
        text_dim,
        mc.bits,
        fusion=mc.fusion,
        nhead=mc.nhead,
        num_layers=mc.num_layers,
        dim_feedforward=mc.dim_feedforward,
        dropout=mc.dropout,
        hidden=mc.hidden,
        head_dropout=mc.head_dropout,
        eval_batch_size=mc.eval_batch_size,
    )


def _check_config(cfg: HashRunConfig) -> None:
    tc = cfg.train
    if tc.loss not in LOSSES:
        raise ValueError(f"train.loss must be one of {LOSSES}, got {tc.loss!r}")
    if tc.optimizer not in ("adam", "adamw", "sgd"):
        raise ValueError(f"train.optimizer must be adam, adamw or sgd, got {tc.optimizer!r}")
    if tc.batch_size < 2:
        raise ValueError(f"train.batch_size must be >= 2 (a contrastive batch), got {tc.batch_size}")
    if len(tc.betas) != 2:
        raise ValueError(f"train.betas must be two numbers, got {tc.betas}")
    if tc.epochs < 0:
        raise ValueError(f"train.epochs must be >= 0, got {tc.epochs}")


# ------------------------------------------------------------------------------------------ trainer


class HashTrainer:
    """Seeded UCMFH training with atomic checkpoints (every ``save_every`` epochs and at the end) and JSONL
    metrics (one record per epoch).

    Batches are a permutation seeded by (seed, epoch), so a resumed run sees the batches an uninterrupted
    one would have seen.
    """

    def __init__(self, cfg: HashRunConfig, model: UCMFH, data: HashDataset, run_dir: Path) -> None:
        _check_config(cfg)
        if cfg.train.feature_weight and data.image_dim != data.text_dim:
            raise ValueError(
                f"the feature-level contrastive term compares image and text encoder outputs, which needs "
                f"equal dimensions (got {data.image_dim} and {data.text_dim}); set train.feature_weight=0 to "
                "train on the codes only"
            )
        self.cfg, self.tc = cfg, cfg.train
        self.device = torch.device(cfg.device)
        self.model = model.to(self.device)
        self.data = data
        self.run_dir = run_dir
        tc = self.tc
        groups = [
            {"params": model.encoder_parameters(), "lr": tc.lr_encoder},
            {"params": model.head_parameters(), "lr": tc.lr_heads},
        ]
        # One optimiser with two groups equals the official three Adam instances (Adam is per parameter).
        if tc.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(groups, lr=tc.lr_heads, weight_decay=tc.weight_decay)
        else:
            cls = torch.optim.AdamW if tc.optimizer == "adamw" else torch.optim.Adam
            self.optimizer = cls(groups, betas=tuple(tc.betas), weight_decay=tc.weight_decay)
        self.feature_loss = self._contrastive(tc.loss)
        if tc.loss == "hashnet":
            self.hash_loss = HashNetLoss(alpha=tc.hashnet_alpha or 10.0 / model.bits)
        else:
            self.hash_loss = self._contrastive(tc.loss)
        self.image = torch.from_numpy(data.train.image)
        self.text = torch.from_numpy(data.train.text)
        rel = data.train.relevance
        self.relevance = torch.from_numpy(rel.astype(np.int64) if rel.ndim == 1 else rel.astype(np.float32))
        self.epoch = 0
        self.step = 0

    def _contrastive(self, loss: str):
        if loss == "balanced":
            return BalancedInfoNCE(self.tc.temperature)
        if loss == "infonce_i2t":
            return InfoNCE(self.tc.temperature, variant="i2t")
        return InfoNCE(self.tc.temperature)  # infonce, and the feature term of hashnet

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "epoch": self.epoch,
            "step": self.step,
            "rng": rng_state(),
            "config": asdict(self.cfg),
        }

    def resume(self, path: Path) -> None:
        state = load_checkpoint(path, map_location=self.device)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.epoch, self.step = state["epoch"], state["step"]
        set_rng_state(state["rng"])
        _logger.info("resumed %s at epoch %d", path, self.epoch)

    def _batches(self, epoch: int) -> list[torch.Tensor]:
        n = self.image.shape[0]
        gen = torch.Generator().manual_seed(self.tc.seed * 100003 + epoch)
        perm = torch.randperm(n, generator=gen)
        bs = min(self.tc.batch_size, n)  # a training set smaller than one batch is one batch
        batches = list(perm.split(bs))
        if self.tc.drop_last and len(batches) > 1 and len(batches[-1]) < bs:
            batches.pop()
        return [b for b in batches if len(b) >= 2]

    def _loss(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        img, txt = self.image[idx].to(self.device), self.text[idx].to(self.device)
        out = self.model(img, txt)
        feat = (
            self.feature_loss(out.img_feat, out.txt_feat)
            if self.tc.feature_weight
            else out.img_hash.new_zeros(())
        )
        if self.tc.loss == "hashnet":
            rel = self.relevance[idx].to(self.device)
            code = self.hash_loss(out.img_hash, out.txt_hash, rel, rel)
        else:
            code = self.hash_loss(out.img_hash, out.txt_hash)
        total = self.tc.feature_weight * feat + self.tc.hash_weight * code
        return {"loss": total, "loss_feature": feat, "loss_hash": code}

    def fit(self) -> dict[str, Any]:
        """Train to ``epochs``; one JSONL record and one atomic ``last.pt`` per epoch."""
        if self.tc.num_threads:
            torch.set_num_threads(self.tc.num_threads)
        start = time.perf_counter()
        while self.epoch < self.tc.epochs:
            self.model.train()
            sums: dict[str, float] = {}
            batches = self._batches(self.epoch)
            for idx in batches:
                losses = self._loss(idx)
                if not torch.isfinite(losses["loss"]):
                    raise FloatingPointError(f"non-finite loss at epoch {self.epoch}, step {self.step}")
                self.optimizer.zero_grad(set_to_none=True)
                losses["loss"].backward()
                self.optimizer.step()
                self.step += 1
                for k, v in losses.items():
                    sums[k] = sums.get(k, 0.0) + float(v.detach())
            self.epoch += 1
            record = {
                "split": "train",
                "epoch": self.epoch,
                "step": self.step,
                **{k: v / max(1, len(batches)) for k, v in sums.items()},
                "elapsed_s": round(time.perf_counter() - start, 3),
            }
            _log_jsonl(self.run_dir, record)
            # A CLIP-sized model with Adam state is ~350 MB: checkpoint every few epochs, and at the end.
            if self.epoch == self.tc.epochs or (self.tc.save_every and self.epoch % self.tc.save_every == 0):
                atomic_save(self.state_dict(), self.run_dir / "last.pt")
        if not (self.run_dir / "last.pt").exists():  # epochs == 0 (evaluate an untrained model)
            atomic_save(self.state_dict(), self.run_dir / "last.pt")
        return {"epochs": self.epoch, "steps": self.step, "train_seconds": time.perf_counter() - start}


def _log_jsonl(run_dir: Path, record: dict[str, Any]) -> None:
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps(record) + "\n")


# ------------------------------------------------------------------------------------------ evaluation


@torch.no_grad()
def encode_split(
    model: UCMFH, image: np.ndarray, text: np.ndarray, device: str | torch.device = "cpu"
) -> tuple[np.ndarray, np.ndarray]:
    """±1 int8 codes ``(image (N, bits), text (N, bits))`` of a split, in eval mode."""
    model.eval()
    img, txt = torch.from_numpy(image).to(device), torch.from_numpy(text).to(device)
    h_img, h_txt = model.encode_pairs(img, txt)
    return (
        UCMFH.codes(h_img).cpu().numpy().astype(np.int8),
        UCMFH.codes(h_txt).cpu().numpy().astype(np.int8),
    )


def _report(q, db, ql, dbl, ec: HashEvalConfig, measure: str) -> dict[str, float]:
    rep = retrieval_report(q, db, ql, dbl, map_k=ec.topk, ks=ec.ks, measure=measure)
    out = {f"map@{ec.topk}": rep["map"]}
    out.update({f"p@{k}": v for k, v in rep["precision"].items()})
    out.update({f"r@{k}": v for k, v in rep["recall"].items()})
    if ec.map_all:
        out["map@all"] = retrieval_report(q, db, ql, dbl, map_k=len(db), ks=[1], measure=measure)["map"]
    return out


def evaluate_model(
    model: UCMFH, data: HashDataset, ec: HashEvalConfig, device: str | torch.device = "cpu"
) -> dict[str, Any]:
    """I->T and T->I metrics of ``model`` on ``data.query`` against ``data.retrieval`` (Hamming ranking).

    Keys: ``i2t_map@50``, ``i2t_p@k``, ``i2t_r@k`` and the ``t2i_`` versions, plus ``fusion`` (results of
    ``official_fused`` models use the target's paired modality at query time and must be labelled so).
    """
    q_img, q_txt = encode_split(model, data.query.image, data.query.text, device)
    db_img, db_txt = encode_split(model, data.retrieval.image, data.retrieval.text, device)
    ql, dbl = data.query.relevance, data.retrieval.relevance
    out: dict[str, Any] = {
        "bits": model.bits,
        "fusion": model.fusion,
        "relevance": "labels" if data.has_labels else "pair",
    }
    for name, q, db in (("i2t", q_img, db_txt), ("t2i", q_txt, db_img)):
        out.update({f"{name}_{k}": v for k, v in _report(q, db, ql, dbl, ec, "hamming").items()})
    return out


# ------------------------------------------------------------------------------------------ runs


def _run_dir(cfg: HashRunConfig) -> Path:
    name = cfg.name or f"ucmfh_{cfg.data.format}_{cfg.model.bits}b_{cfg.train.loss}_s{cfg.train.seed}"
    return Path(cfg.output_dir) / name


def train_hashing(
    cfg: HashRunConfig, *, resume: bool = False, data: HashDataset | None = None
) -> dict[str, Any]:
    """Build data and model from ``cfg``, train, evaluate once, write the run directory; returns the summary.

    Args:
        cfg: the resolved config.
        resume: continue ``run_dir/last.pt``; without it an existing run directory with a checkpoint is
            an error (no silent overwrite).
        data: an already built dataset (benchmarks reuse one); built from ``cfg.data`` when None.
    """
    _check_config(cfg)
    run_dir = _run_dir(cfg)
    if (run_dir / "last.pt").exists() and not resume:
        raise FileExistsError(f"{run_dir} already holds a run; pass --resume or choose another name")
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    seed_everything(cfg.train.seed)
    data = data if data is not None else build_dataset(cfg.data)
    if cfg.train.loss == "hashnet" and not data.has_labels:
        _logger.info("hashnet loss without labels: pairs are similar only to themselves (ids)")
    model = build_model(cfg.model, data.image_dim, data.text_dim)
    trainer = HashTrainer(cfg, model, data, run_dir)
    if resume and (run_dir / "last.pt").exists():
        trainer.resume(run_dir / "last.pt")
    fit = trainer.fit()
    export_weights(model, asdict(cfg), run_dir, data=data.summary())
    metrics = evaluate_model(model, data, cfg.eval, cfg.device)
    _log_jsonl(run_dir, {"split": "test", "epoch": trainer.epoch, "step": trainer.step, **metrics})
    (run_dir / "eval.json").write_text(json.dumps(metrics, indent=2))
    return {"run_dir": str(run_dir), "data": data.summary(), **fit, **metrics}


def load_run(
    run_dir: str | Path, overrides: list[str] | None = None, device: str | None = None
) -> tuple[HashRunConfig, UCMFH, HashDataset]:
    """Config, trained model (eval mode) and dataset of a run directory."""
    from patchword.config import load_config

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{run_dir} is not a hashing run directory (no config.yaml)")
    cfg = load_config(HashRunConfig, run_dir / "config.yaml", overrides or [])
    if device:
        cfg.device = device
    data = build_dataset(cfg.data)
    model = build_model(cfg.model, data.image_dim, data.text_dim)
    model.load_state_dict(load_checkpoint(run_dir / "last.pt", map_location=cfg.device)["model"])
    return cfg, model.to(cfg.device).eval(), data
