"""End-to-end runs: build data and model from a :class:`RunConfig`, train, evaluate, summarise."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from patchword.config import save_config
from patchword.data.split import RetrievalSplit
from patchword.data.vocab import WordVocab
from patchword.eval.evaluate import evaluate_encoded
from patchword.model import RetrievalModel, build_model
from patchword.train.checkpoint import export_weights, load_checkpoint, seed_everything
from patchword.train.config import DataConfig, RunConfig
from patchword.train.data import ArrayImages, EncodedSplit, FileImages, encode_split
from patchword.train.trainer import Trainer

__all__ = ["PreparedData", "prepare_data", "create_run_dir", "train_run", "evaluate_run"]

_logger = logging.getLogger(__name__)


class PreparedData:
    """Encoded train/dev/test splits, the tokenizer, and (synthetic data) the oracle bound of each split."""

    def __init__(self, splits: dict[str, EncodedSplit], tokenizer, raw: dict[str, RetrievalSplit],
                 oracle: dict[str, dict[str, float]]) -> None:
        self.splits, self.tokenizer, self.raw, self.oracle = splits, tokenizer, raw, oracle

    @property
    def vocab_size(self) -> int | None:
        return len(self.tokenizer) if isinstance(self.tokenizer, WordVocab) else None


def _load_raw_splits(dc: DataConfig) -> tuple[dict[str, RetrievalSplit], dict[str, Any], dict[str, Any]]:
    """-> (splits by role, fits oracles by role, images by role)."""
    roles = {"train": dc.train_split, "dev": dc.dev_split, "test": dc.test_split}
    if dc.dataset == "synthetic":
        from patchword.data.synthetic import SyntheticConfig, SyntheticScenes

        syn = SyntheticConfig(
            seed=dc.synthetic_seed, image_size=dc.synthetic_image_size, num_train=dc.num_train,
            num_dev=dc.num_dev, num_test=dc.num_test, dense_omit_prob=dc.dense_omit_prob,
            dense_wrong_attr_prob=dc.dense_wrong_attr_prob,
        )
        ds = SyntheticScenes.load_or_generate(syn, cache_dir=dc.cache_dir or None)
        raw = {role: ds.split(name) for role, name in roles.items()}
        fits = {role: ds.oracle(name) for role, name in roles.items()}
        images = {role: ArrayImages(raw[role].images) for role in roles}
        return raw, fits, images
    if dc.dataset == "laps":
        from patchword.data.captions import load_laps_split

        dense = {"train": dc.dense_train, "dev": dc.dense_dev, "test": dc.dense_test}
        raw = {
            role: load_laps_split(dc.root, name, dc.image_root, dense_jsonl=(dense[role] or None) if dc.dense else None)
            for role, name in roles.items()
        }
    elif dc.dataset == "karpathy":
        from patchword.data.captions import load_karpathy_json

        raw = {role: load_karpathy_json(dc.root, name, dc.image_root) for role, name in roles.items()}
    else:
        raise ValueError(f"data.dataset must be synthetic, laps or karpathy, got {dc.dataset!r}")
    images = {role: FileImages(split.images, dc.image_size) for role, split in raw.items()}
    return raw, {role: None for role in roles}, images


def _tokenizer(dc: DataConfig, train: RetrievalSplit):
    if dc.tokenizer == "word":
        texts = list(train.captions) + list(train.dense_captions or [])
        return WordVocab.build(texts)
    if dc.tokenizer == "bert":
        from patchword.encoders import BertCaptionTokenizer

        return BertCaptionTokenizer.from_pretrained(dc.bert_vocab)
    raise ValueError(f"data.tokenizer must be word or bert, got {dc.tokenizer!r}")


def prepare_data(dc: DataConfig, tokenizer=None) -> PreparedData:
    """Load the three splits, build (or reuse) the tokenizer, tokenise everything once."""
    raw, fits, images = _load_raw_splits(dc)
    tokenizer = tokenizer or _tokenizer(dc, raw["train"])
    splits = {
        role: encode_split(
            raw[role], tokenizer, images[role], max_caption_len=dc.max_caption_len,
            max_dense_len=dc.max_dense_len, use_dense=dc.dense, fits=fits[role],
        )
        for role in raw
    }
    oracle = {}
    if dc.dataset == "synthetic":
        from patchword.data.synthetic import oracle_metrics

        oracle = {role: oracle_metrics(raw[role].fits, raw[role].txt2img) for role in ("dev", "test")}
    return PreparedData(splits, tokenizer, raw, oracle)


def create_run_dir(cfg: RunConfig, *, resume: bool = False) -> Path:
    """``output_dir/name``; an existing directory is an error unless resuming (never overwritten)."""
    run_dir = Path(cfg.output_dir) / cfg.name
    if run_dir.exists() and not resume and any(run_dir.iterdir()):
        raise FileExistsError(
            f"run directory {run_dir} already exists; choose another name= or pass --resume to continue it"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def _save_tokenizer(tokenizer, run_dir: Path) -> None:
    if isinstance(tokenizer, WordVocab):
        tokenizer.save(run_dir / "vocab.json")


def train_run(cfg: RunConfig, *, resume: bool = False, data: PreparedData | None = None) -> dict[str, Any]:
    """Train and evaluate; writes config.yaml, metrics.jsonl, checkpoints, export/ and summary.json.

    Returns:
        The summary dict (test metrics of the best dev checkpoint, oracle bound, timings).
    """
    run_dir = create_run_dir(cfg, resume=resume)
    seed_everything(cfg.seed)
    t0 = time.perf_counter()
    data = data or prepare_data(cfg.data)
    _logger.info("data ready in %.1fs: %s", time.perf_counter() - t0,
                 {k: (v.num_images, v.num_captions) for k, v in data.splits.items()})
    save_config(cfg, run_dir / "config.yaml")
    _save_tokenizer(data.tokenizer, run_dir)
    seed_everything(cfg.seed)
    model = build_model(cfg.model, vocab_size=data.vocab_size)
    trainer = Trainer(cfg, model, data.splits["train"], data.splits["dev"], run_dir)
    if resume and (run_dir / "last.pt").is_file():
        trainer.resume(run_dir / "last.pt")
    fit = trainer.fit()
    if (run_dir / "best.pt").is_file():
        model.load_state_dict(load_checkpoint(run_dir / "best.pt")["model"])
    export_weights(model, asdict(cfg), run_dir / "export", vocab_size=data.vocab_size)
    summary = evaluate_run(cfg, model, data, run_dir)
    summary.update({k: v for k, v in fit.items()})
    summary["skipped_steps"] = trainer.skipped_steps
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def evaluate_run(cfg: RunConfig, model: RetrievalModel, data: PreparedData, run_dir: Path) -> dict[str, Any]:
    """Test-split metrics (plus the oracle bound on synthetic data); writes metrics.json."""
    role = "test" if cfg.eval.split in ("test", cfg.data.test_split) else "dev"
    t0 = time.perf_counter()
    metrics = evaluate_encoded(model, data.splits[role], cfg.eval, device=torch.device(cfg.device),
                               progress=cfg.progress)
    metrics["eval_seconds"] = time.perf_counter() - t0
    if role in data.oracle:
        metrics["oracle_rsum"] = data.oracle[role]["rsum"]
    metrics["split"] = role
    metrics["dense_pairing"] = cfg.model.dense_pairing
    metrics["leaky"] = cfg.data.dense and cfg.model.dense_pairing == "caption" and cfg.model.matcher == "seps"
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics
