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
from patchword.eval.metrics import retrieval_metrics
from patchword.eval.scoring import encode_image_tokens, encode_text_tokens
from patchword.model import RetrievalModel, build_model
from patchword.train.checkpoint import export_weights, load_checkpoint, seed_everything, warm_start
from patchword.train.config import DataConfig, RunConfig
from patchword.train.data import ArrayImages, EncodedSplit, FileImages, encode_split
from patchword.train.trainer import Trainer

__all__ = [
    "PreparedData",
    "prepare_data",
    "create_run_dir",
    "train_run",
    "evaluate_run",
    "evaluate_model",
    "check_model_data",
    "vocab_words",
    "REGION_DATASETS",
]

#: Datasets whose "images" are precomputed region features, (B, R, D) per batch (model.image_encoder=precomp).
REGION_DATASETS = ("precomp", "synthetic_regions")

_logger = logging.getLogger(__name__)


class PreparedData:
    """Encoded train/dev/test splits, the tokenizer, and (synthetic data) the oracle bound of each split."""

    def __init__(
        self,
        splits: dict[str, EncodedSplit],
        tokenizer,
        raw: dict[str, RetrievalSplit],
        oracle: dict[str, dict[str, float]],
    ) -> None:
        self.splits, self.tokenizer, self.raw, self.oracle = splits, tokenizer, raw, oracle

    @property
    def vocab_size(self) -> int | None:
        return len(self.tokenizer) if isinstance(self.tokenizer, WordVocab) else None


def _load_raw_splits(dc: DataConfig) -> tuple[dict[str, RetrievalSplit], dict[str, Any], dict[str, Any]]:
    """-> (splits by role, fits oracles by role, images by role)."""
    roles = {"train": dc.train_split, "dev": dc.dev_split, "test": dc.test_split}
    if dc.dataset == "precomp":
        from patchword.data.precomp import RegionFeatures, load_precomp_split

        if not dc.root:
            raise ValueError("data.dataset=precomp needs data.root (the {split}_ims.npy directory)")
        raw = {role: load_precomp_split(dc.root, name, mmap=dc.mmap) for role, name in roles.items()}
        return raw, {role: None for role in roles}, {role: RegionFeatures(raw[role].images) for role in roles}
    if dc.dataset in ("synthetic", "synthetic_regions"):
        from patchword.data.synthetic import SyntheticConfig, SyntheticScenes

        syn = SyntheticConfig(
            seed=dc.synthetic_seed,
            image_size=dc.synthetic_image_size,
            num_train=dc.num_train,
            num_dev=dc.num_dev,
            num_test=dc.num_test,
            dense_omit_prob=dc.dense_omit_prob,
            dense_wrong_attr_prob=dc.dense_wrong_attr_prob,
        )
        ds = SyntheticScenes.load_or_generate(syn, cache_dir=dc.cache_dir or None)
        raw = {role: ds.split(name) for role, name in roles.items()}
        fits = {role: ds.oracle(name) for role, name in roles.items()}
        if dc.dataset == "synthetic_regions":
            from patchword.data.precomp import RegionFeatureConfig, RegionFeatures, synthetic_region_split

            rcfg = RegionFeatureConfig(
                num_regions=dc.num_regions,
                dim=dc.region_dim,
                boxes_per_object=dc.boxes_per_object,
                noise=dc.region_noise,
                seed=dc.synthetic_seed,
            )
            raw = {
                role: synthetic_region_split(
                    raw[role], ds[name].scenes, rcfg, num_shapes=len(syn.shapes), num_colours=len(syn.colours)
                )
                for role, name in roles.items()
            }
            return raw, fits, {role: RegionFeatures(raw[role].images) for role in roles}
        images = {role: ArrayImages(raw[role].images) for role in roles}
        return raw, fits, images
    if dc.dataset == "laps":
        from patchword.data.captions import load_laps_split

        dense = {"train": dc.dense_train, "dev": dc.dense_dev, "test": dc.dense_test}
        raw = {
            role: load_laps_split(
                dc.root, name, dc.image_root, dense_jsonl=(dense[role] or None) if dc.dense else None
            )
            for role, name in roles.items()
        }
    elif dc.dataset == "karpathy":
        from patchword.data.captions import load_karpathy_json

        raw = {role: load_karpathy_json(dc.root, name, dc.image_root) for role, name in roles.items()}
    else:
        raise ValueError(
            f"data.dataset must be synthetic, laps, karpathy, precomp or synthetic_regions: {dc.dataset!r}"
        )
    images = {role: FileImages(split.images, dc.image_size) for role, split in raw.items()}
    return raw, {role: None for role in roles}, images


def _tokenizer(dc: DataConfig, train: RetrievalSplit):
    if dc.tokenizer == "word":
        if dc.vocab_path:  # e.g. SCAN's {data}_precomp_vocab.json
            return WordVocab.load(dc.vocab_path)
        texts = list(train.captions) + list(train.dense_captions or [])
        return WordVocab.build(texts, min_count=dc.vocab_min_count)
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
            raw[role],
            tokenizer,
            images[role],
            max_caption_len=dc.max_caption_len,
            max_dense_len=dc.max_dense_len,
            use_dense=dc.dense and dc.dataset not in REGION_DATASETS,
            fits=fits[role],
        )
        for role in raw
    }
    oracle = {}
    if dc.dataset in ("synthetic", "synthetic_regions"):
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
    _logger.info(
        "data ready in %.1fs: %s",
        time.perf_counter() - t0,
        {k: (v.num_images, v.num_captions) for k, v in data.splits.items()},
    )
    check_model_data(cfg, data)  # before anything is written: a config error leaves the directory empty
    save_config(cfg, run_dir / "config.yaml")
    _save_tokenizer(data.tokenizer, run_dir)
    seed_everything(cfg.seed)
    model = build_model(cfg.model, vocab_size=data.vocab_size, vocab_words=vocab_words(data.tokenizer))
    if cfg.train.init_from:
        warm_start(model, cfg.train.init_from)
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
    metrics = evaluate_model(
        model, data.splits[role], cfg, device=torch.device(cfg.device), progress=cfg.progress
    )
    metrics["eval_seconds"] = time.perf_counter() - t0
    if role in data.oracle:
        metrics["oracle_rsum"] = data.oracle[role]["rsum"]
    metrics["split"] = role
    metrics["dense_pairing"] = cfg.model.dense_pairing
    metrics["leaky"] = cfg.data.dense and cfg.model.dense_pairing == "caption" and cfg.model.matcher == "seps"
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics


def vocab_words(tokenizer) -> list[str] | None:
    """The word vocabulary by id (aligns GloVe text files with the GRU encoder); None for other tokenizers."""
    return list(tokenizer.idx2word) if isinstance(tokenizer, WordVocab) else None


def check_model_data(cfg: RunConfig, data: PreparedData) -> None:
    """Raise a ``ValueError`` naming the config keys when the image encoder cannot read the data."""
    region_data = cfg.data.dataset in REGION_DATASETS
    if region_data != (cfg.model.image_encoder == "precomp"):
        raise ValueError(
            f"data.dataset={cfg.data.dataset} holds region features: set model.image_encoder=precomp"
            if region_data
            else f"model.image_encoder=precomp needs region features: data.dataset in {REGION_DATASETS}"
        )
    if region_data:
        images = data.splits["train"].images
        want = (cfg.model.precomp.num_regions, cfg.model.precomp.region_dim)
        if (images.num_regions, images.dim) != want:
            raise ValueError(
                f"the region features have {images.num_regions} regions of {images.dim} dims but "
                f"model.precomp.num_regions={want[0]}, model.precomp.region_dim={want[1]}"
            )


class _ImageRange:
    """Images ``[offset, offset + count)`` of an image source (a COCO 1K fold)."""

    def __init__(self, images, offset: int, count: int) -> None:
        self.images, self.offset, self.count = images, offset, count

    def __len__(self) -> int:
        return self.count

    def batch(self, indices: torch.Tensor, train: bool) -> torch.Tensor:
        return self.images.batch(indices + self.offset, train)


def _image_range(split: EncodedSplit, lo: int, hi: int) -> EncodedSplit:
    """Images [lo, hi) of ``split`` with exactly their captions."""
    keep = ((split.txt2img >= lo) & (split.txt2img < hi)).nonzero().squeeze(1)
    return EncodedSplit(
        name=f"{split.name}[{lo}:{hi}]",
        images=_ImageRange(split.images, lo, hi - lo),
        cap_ids=split.cap_ids[keep],
        cap_lens=split.cap_lens[keep],
        txt2img=split.txt2img[keep] - lo,
        captions=[split.captions[i] for i in keep.tolist()],
    )


@torch.no_grad()
def _two_stage_metrics(model: RetrievalModel, split: EncodedSplit, plan, *, device, progress) -> dict:
    """Metrics of the two-stage search ``plan`` (``TGDTMatcher.two_stage_plan``) on ``split``, plus "sims"."""
    from patchword.eval.two_stage import two_stage_scores

    was_training = model.training
    model.eval()
    try:
        img = encode_image_tokens(model, split.images, device=device, progress=progress)
        cap = encode_text_tokens(model, split.cap_ids, split.cap_lens, device=device, progress=progress)
    finally:
        model.train(was_training)
    result = two_stage_scores(
        plan.fine,
        img,
        cap,
        split.cap_lens,
        k=(plan.k_i2t, plan.k_t2i),
        alpha=plan.alpha,
        device=device,
        progress=progress,
    )
    metrics: dict[str, Any] = retrieval_metrics(result.sims, split.txt2img)
    # How often the ground truth never reaches stage 2: what the official evaluator counts as hits.
    own = split.txt2img[None, :] == torch.arange(split.num_images)[:, None]  # (N_img, N_txt)
    i2t_found = own.gather(1, result.i2t_candidates).any(1)
    t2i_found = (result.t2i_candidates == split.txt2img[:, None]).any(1)
    metrics.update(
        shortlist_i2t=int(result.i2t_candidates.shape[1]),
        shortlist_t2i=int(result.t2i_candidates.shape[1]),
        hybrid_alpha=plan.alpha,
        pairs_scored=result.pairs_scored,
        shortlist_miss_i2t=100.0 * float((~i2t_found).float().mean()),
        shortlist_miss_t2i=100.0 * float((~t2i_found).float().mean()),
        sims=result.sims,
    )
    return metrics


def evaluate_model(
    model: RetrievalModel, split: EncodedSplit, cfg: RunConfig, *, device, progress=None, return_sims=False
) -> dict[str, Any]:
    """Metrics of ``model`` on ``split`` as its matcher prescribes.

    A matcher with a two-stage plan (TGDT with ``inference="hybrid"``) is evaluated by the two-stage search
    (global shortlist, fine re-ranking, a ground truth outside the shortlist is a miss); with
    ``eval.coco_1k`` each 1K fold runs its own search, as the official fold-wise evaluation does. Every
    other matcher ranks the full similarity matrix (:func:`~patchword.eval.evaluate.evaluate_encoded`).
    With ``return_sims`` the scores come back under ``"sims"``: one (N_img, N_txt) matrix, or the
    ``(sims_i2t, sims_t2i)`` pair of a two-stage search.
    """
    plan_fn = getattr(model.matcher, "two_stage_plan", None)
    plan = plan_fn() if callable(plan_fn) else None
    if plan is None:
        return evaluate_encoded(
            model, split, cfg.eval, device=device, progress=progress, return_sims=return_sims
        )
    metrics = _two_stage_metrics(model, split, plan, device=device, progress=progress)
    sims = metrics.pop("sims")
    if cfg.eval.coco_1k:
        folds = []
        for f in range(5):
            lo, hi = f * split.num_images // 5, (f + 1) * split.num_images // 5
            part = _image_range(split, lo, hi)
            fold = _two_stage_metrics(model, part, plan, device=device, progress=progress)
            fold.pop("sims")
            folds.append(fold)
        metrics.update({f"coco1k_{key}": sum(fold[key] for fold in folds) / len(folds) for key in folds[0]})
    if return_sims:
        metrics["sims"] = sims
    return metrics
