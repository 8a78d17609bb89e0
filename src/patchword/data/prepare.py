"""From a :class:`DataConfig` to tokenised splits: which files, which splits, which tokenizer.

Only the splits a job needs are read (``patchword eval`` reads the one it scores), and every check on the
data runs here, before a run writes anything: counts, missing or unreadable image files, dense-caption
coverage, non-finite region features. Errors name the file, the row or the config key.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from patchword.data.config import FILE_DATASETS, DataConfig  # FILE_DATASETS: readers import it from here
from patchword.data.overlap import refuse_shared_images
from patchword.data.pipeline import (
    ArrayImages,
    EncodedSplit,
    FileImages,
    ImageSource,
    encode_split,
    text_without_words,
    unknown_words_warning,
)
from patchword.data.split import RetrievalSplit
from patchword.data.tokenizers import NoWordsError, WordVocab
from patchword.errors import ConfigError, DataError, MissingFileError

__all__ = [
    "ROLES",
    "REGION_DATASETS",
    "SYNTHETIC_DATASETS",
    "RawData",
    "PreparedData",
    "load_raw_data",
    "build_tokenizer",
    "prepare_data",
    "eval_role",
    "check_needed_keys",
    "holdout_images",
    "reads_dense_text",
]

_logger = logging.getLogger(__name__)

#: The three roles a dataset's splits play; ``DataConfig.{train,dev,test}_split`` name them on disk.
ROLES = ("train", "dev", "test")
#: Datasets whose "images" are precomputed region features, (B, R, D) per batch.
REGION_DATASETS = ("precomp", "synthetic_regions")
SYNTHETIC_DATASETS = ("synthetic", "synthetic_regions")
#: Datasets whose files may give one id (or feature row) per image: ``data.captions_per_image`` counts
#: their captions (a Karpathy json lists each image's own; the synthetic scenes have 5).
CAPTION_COUNT_DATASETS = ("laps", "precomp")
# Fixed, so that runs with different seeds validate on the same held-out images.
_HOLDOUT_SEED = 0


def eval_role(dc: DataConfig, split: str) -> str:
    """``eval.split`` (a role or the dataset's own split name) -> ``"test"`` or ``"dev"``."""
    if split in ("test", dc.test_split):
        return "test"
    if split in ("dev", dc.dev_split):
        return "dev"
    raise ConfigError(
        "eval.split", f"must be test or dev (or {dc.test_split} / {dc.dev_split}), got {split!r}"
    )


def holdout_images(num_images: int, count: int) -> np.ndarray:
    """Sorted indices of ``count`` images drawn (seeded, fixed) from ``num_images``: the dev split that
    ``data.dev_from_train`` holds out."""
    rng = np.random.default_rng(_HOLDOUT_SEED)
    return np.sort(rng.choice(num_images, size=count, replace=False))


@dataclass
class RawData:
    """Splits as read from disk (or generated), before tokenisation.

    Attributes:
        splits: role -> :class:`RetrievalSplit`.
        images: role -> the split's :class:`ImageSource`.
        fits: role -> a fits oracle (synthetic data) or None.
    """

    splits: dict[str, RetrievalSplit]
    images: dict[str, ImageSource]
    fits: dict[str, Any] = field(default_factory=dict)


class PreparedData:
    """Encoded splits by role, the tokenizer, the raw splits and (synthetic data) each split's oracle."""

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

    @property
    def vocab_words(self) -> list[str] | None:
        """The word vocabulary by id (aligns GloVe files with the GRU encoder); None for BERT."""
        return list(self.tokenizer.idx2word) if isinstance(self.tokenizer, WordVocab) else None


def check_needed_keys(dc: DataConfig, roles: Sequence[str], use_dense: bool) -> None:
    """Config keys that must name files for these roles, checked before anything is read (an import checks
    its run's evaluation split so before writing it)."""
    if dc.dataset in ("laps", "karpathy", "precomp") and not dc.root:
        what = {"laps": "{split}_caps.txt directory", "karpathy": "dataset_*.json file"}
        raise ConfigError(
            "data.root",
            f"data.dataset={dc.dataset} needs data.root (the "
            f"{what.get(dc.dataset, '{split}_ims.npy directory')})",
        )
    if dc.dataset in FILE_DATASETS and not dc.image_root:
        raise ConfigError("data.image_root", f"data.dataset={dc.dataset} needs the image directory")
    dc.refuse_unread_keys()  # keys that nothing would read, yet the run's config would record
    if not use_dense or dc.dataset not in FILE_DATASETS:
        return
    for role in roles:
        if role == "dev" and dc.dev_from_train:
            role = "train"  # the held-out images bring their training dense captions
        key = f"dense_{role}"
        if not getattr(dc, key):
            hint = ""
            if role == "dev":
                hint = (
                    "; the SEPS release has no dev-split dense captions: set data.dev_from_train=1000 to "
                    "validate on 1000 held-out training images (with their dense captions), or make a file "
                    "with `patchword densify`"
                )
            raise ConfigError(
                f"data.{key}",
                f"is not set, but the matcher reads dense captions on the {role} split "
                f"(set data.{key}=FILE.jsonl, or data.dense=false for a model without dense text){hint}",
            )


def _synthetic(dc: DataConfig, roles: Sequence[str]) -> RawData:
    from patchword.data.synthetic import SyntheticScenes

    syn = dc.synthetic_config()
    ds = SyntheticScenes.load_or_generate(syn, cache_dir=dc.cache_dir or None)
    names = {role: getattr(dc, f"{role}_split") for role in roles}
    raw = {role: ds.split(name) for role, name in names.items()}
    fits = {role: ds.oracle(name) for role, name in names.items()}
    if dc.dataset == "synthetic":
        return RawData(raw, {role: ArrayImages(raw[role].images) for role in roles}, fits)
    from patchword.data.precomp import RegionFeatures
    from patchword.data.synthetic.regions import RegionFeatureConfig, synthetic_region_split

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
        for role, name in names.items()
    }
    return RawData(raw, {role: RegionFeatures(raw[role].images) for role in roles}, fits)


def _image_files(dc: DataConfig, roles: Sequence[str], use_dense: bool, dense_gaps_ok: bool) -> RawData:
    from patchword.data.dense_gaps import attach_dense, refuse_images_without_dense
    from patchword.data.karpathy import karpathy_split_reader, require_karpathy_split
    from patchword.data.laps import load_laps_split

    # the held-out dev split comes out of the training split; a Karpathy json (140 MB for COCO) is parsed
    # once, for every split read and the overlap check
    to_read = sorted({("train" if r == "dev" and dc.dev_from_train else r) for r in roles}, key=ROLES.index)
    karpathy = karpathy_split_reader(dc.root, dc.image_root) if dc.dataset == "karpathy" else None
    raw = {}
    for role in to_read:
        name = getattr(dc, f"{role}_split")
        dense = (getattr(dc, f"dense_{role}") or None) if use_dense else None
        # The readers check no file: _without_bad_images below finds the missing files with the others,
        # and reports them all in one line with data.skip_bad_images as the way to leave them out.
        if dc.dataset == "laps":
            raw[role] = load_laps_split(
                dc.root,
                name,
                dc.image_root,
                check_images=False,
                captions_per_image=dc.captions_per_image,
            )
        else:
            require_karpathy_split(name, f"data.{role}_split", dc.root)
            raw[role] = karpathy(name)
        if dense:  # data.skip_bad_images: the lines densify --skip-bad-images left out may be missing
            raw[role] = attach_dense(raw[role], dense, missing_ok=dense_gaps_ok)
    if dc.dev_from_train and "train" in raw:  # the held-out images leave training in every case
        train = raw["train"]
        if dc.dev_from_train >= train.num_images:
            raise ConfigError(
                "data.dev_from_train",
                f"holds out {dc.dev_from_train} images but the training split has only {train.num_images}",
            )
        held = holdout_images(train.num_images, dc.dev_from_train)
        rest = np.setdiff1d(np.arange(train.num_images), held)
        raw["dev"] = train.subset(held, name=f"{train.name}[held out {len(held)}]")
        raw["train"] = train.subset(rest, name=f"{train.name}[without the held-out {len(held)}]")
        _logger.info("dev split: %d training images held out (data.dev_from_train)", len(held))
        raw = {role: raw[role] for role in roles}
    refuse_shared_images(dc, raw, karpathy=karpathy)  # before the images are decoded: it reads no image
    if dc.check_images:
        if not os.path.isdir(dc.image_root):  # else every file of every split would be listed missing
            raise MissingFileError(f"data.image_root={dc.image_root}: no such directory")
        for role in roles:
            raw[role] = _without_bad_images(raw[role], f"{role} split", dc.skip_bad_images)
            # the images without a dense line must have gone with the unusable ones
            refuse_images_without_dense(raw[role], f"{role} split")
    images = {role: FileImages(raw[role].images, dc.image_size, dc.exif_orientation) for role in roles}
    return RawData(raw, images, {role: None for role in roles})


def _without_bad_images(split: RetrievalSplit, what: str, skip: bool) -> RetrievalSplit:
    """``split`` once every image file decoded completely; the unusable ones (missing, empty, not an image,
    truncated, damaged) refuse it, or with ``skip`` leave it with their captions and dense captions.

    Decoding every image costs about 2 ms per photo-sized JPEG and core (see
    :func:`~patchword.data.images.find_bad_images`), paid once per ``train`` / ``eval`` start.

    Raises:
        DataError: naming the count and the first few files (with ``skip``: only when none is usable).
    """
    from patchword.data.images import describe_bad_images, find_bad_images

    bad = find_bad_images(split.images, what=what)
    if not bad:
        return split
    message = describe_bad_images(bad, split.num_images, what)
    if not skip:
        raise DataError(
            f"{message}; replace or delete them (`patchword data check` lists them all), or set "
            "data.skip_bad_images=true to leave them and their captions out"
        )
    unusable = {path for path, _ in bad}
    keep = [i for i, path in enumerate(split.images) if os.fspath(path) not in unusable]
    if not keep:
        raise DataError(f"{message}: no image of the {what} is left")
    kept = split.subset(keep, name=split.name)
    _logger.warning(
        "%s: leaving out %d unusable image files and their %d captions (data.skip_bad_images): %s",
        what,
        len(bad),
        split.num_captions - kept.num_captions,
        message,
    )
    return kept


def _precomp(dc: DataConfig, roles: Sequence[str]) -> RawData:
    from patchword.data.precomp import RegionFeatures, load_precomp_split, load_region_boxes

    raw = {
        role: load_precomp_split(
            dc.root, getattr(dc, f"{role}_split"), mmap=dc.mmap, captions_per_image=dc.captions_per_image
        )
        for role in roles
    }
    refuse_shared_images(dc, raw)
    sources = {
        role: RegionFeatures(
            split.images,
            load_region_boxes(dc.root, getattr(dc, f"{role}_split"), split.images.shape)
            if dc.region_boxes
            else None,
        )
        for role, split in raw.items()
    }
    return RawData(raw, sources, {role: None for role in roles})


def load_raw_data(
    dc: DataConfig,
    roles: Sequence[str] = ROLES,
    *,
    use_dense: bool | None = None,
    dense_gaps_ok: bool | None = None,
) -> RawData:
    """Read (or generate) the splits of ``roles``, checking the files; nothing is tokenised yet.

    Args:
        dc: the data config.
        roles: which of ``train``, ``dev``, ``test`` to read.
        use_dense: read dense captions (default: ``dc.dense``, never for region features).
        dense_gaps_ok: a dense file may lack some images' lines (:mod:`patchword.data.dense_gaps`; default
            ``dc.skip_bad_images``): with ``dc.check_images`` only unusable ones' (the rest is refused),
            without it any (they stay, with an empty dense caption: ``patchword data check`` checks them).
    """
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown split roles {sorted(unknown)}; expected a subset of {ROLES}")
    use_dense = _use_dense(dc, use_dense)
    dc = dc.home_expanded()  # the readers open what the config check (train.validate) found
    check_needed_keys(dc, roles, use_dense)
    if dc.dataset in SYNTHETIC_DATASETS:
        return _synthetic(dc, roles)
    if dc.dataset in FILE_DATASETS:
        gaps = dc.skip_bad_images if dense_gaps_ok is None else dense_gaps_ok
        return _image_files(dc, roles, use_dense, gaps)
    return _precomp(dc, roles)


def reads_dense_text(dc: DataConfig, matcher_reads: bool) -> bool:
    """Whether a run on ``dc`` whose matcher reads dense text (``matcher_reads``: its ``consumes_dense``)
    reads any: ``data.dense`` on and a dataset with dense text, never region features, whatever a (saved)
    config's ``data.dense`` says: its records (dense pairing, leaky) and model card follow this."""
    return bool(matcher_reads and dc.dense and dc.dataset not in REGION_DATASETS)


def _use_dense(dc: DataConfig, use_dense: bool | None) -> bool:
    return (dc.dense if use_dense is None else use_dense) and dc.dataset not in REGION_DATASETS


def build_tokenizer(dc: DataConfig, train: RetrievalSplit | None, *, local_files_only: bool = True):
    """The word vocabulary of the training text (or ``data.vocab_path``), or the BERT tokenizer."""
    if dc.tokenizer == "word":
        if dc.vocab_path:  # e.g. SCAN's {data}_precomp_vocab.json, or pretrained encoders' vocabulary
            from patchword.pretrained import resolve_vocab_path

            vocab = WordVocab.load(resolve_vocab_path(dc.vocab_path))
            dc.check_word_split(vocab.split)
            return vocab
        if train is None:
            raise ValueError("a word vocabulary is built from the training split, which was not loaded")
        texts = list(train.captions) + list(train.dense_captions or [])
        try:
            return WordVocab.build(texts, min_count=dc.vocab_min_count, split=dc.word_split)
        except NoWordsError as err:  # its index counts the captions, then the dense captions
            dense = err.index >= train.num_captions
            index = err.index - train.num_captions if dense else err.index
            raise text_without_words(train, err, dense=dense, index=index) from err
    from patchword.data.tokenizers import BertCaptionTokenizer

    # a run config's empty bert_vocab is model.hf_text's, resolved by its check (train.validate) before this
    return BertCaptionTokenizer.from_pretrained(dc.bert_vocab_source(), local_files_only=local_files_only)


def encode_raw(raw: RawData, dc: DataConfig, tokenizer, *, use_dense: bool | None = None) -> PreparedData:
    """Tokenise every loaded split once (the same max lengths in training and evaluation)."""
    use_dense = _use_dense(dc, use_dense)
    splits = {
        role: encode_split(
            split,
            tokenizer,
            raw.images[role],
            max_caption_len=dc.max_caption_len,
            max_dense_len=dc.max_dense_len,
            use_dense=use_dense,
            fits=raw.fits.get(role),
        )
        for role, split in raw.splits.items()
    }
    for split in raw.splits.values():  # a vocabulary not the text's: said, not refused (a user may mean it)
        if note := unknown_words_warning(split, tokenizer):
            _logger.warning(note)
    oracle = {}
    if dc.dataset in SYNTHETIC_DATASETS:
        from patchword.data.synthetic import oracle_metrics

        oracle = {
            role: oracle_metrics(split.fits, split.txt2img)
            for role, split in raw.splits.items()
            if role != "train"
        }
    return PreparedData(splits, tokenizer, raw.splits, oracle)


def prepare_data(
    dc: DataConfig,
    tokenizer=None,
    *,
    roles: Sequence[str] = ROLES,
    use_dense: bool | None = None,
    local_files_only: bool = True,
) -> PreparedData:
    """Load the splits of ``roles``, build (or reuse) the tokenizer, tokenise everything once."""
    raw = load_raw_data(dc, roles, use_dense=use_dense)
    if tokenizer is None:
        tokenizer = build_tokenizer(dc, raw.splits.get("train"), local_files_only=local_files_only)
    return encode_raw(raw, dc, tokenizer, use_dense=use_dense)
