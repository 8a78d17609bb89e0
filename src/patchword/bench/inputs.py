"""The workload of the scoring benchmark: the matchers scored and their ViT-224-shaped inputs.

Token *values* do not change the cost of exact scoring, token *counts* do: caption lengths are the BERT
ids of the Flickr30K 1K test captions and dense lengths those of the SEPS LLaVA captions of its images
(``../shared/data``), or a log-normal stand-in with the same medians when that folder is absent.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

# DEFAULT_BERT_VOCAB: the vocabulary of the dense lengths when none is named (used where it is cached
# offline, else word counts): the data section's default, re-exported here
from patchword.data.config import DEFAULT_BERT_VOCAB
from patchword.errors import ConfigError, MissingFileError, PatchwordError

if TYPE_CHECKING:
    from patchword.data.tokenizers import BertCaptionTokenizer

__all__ = [
    "VIT_PATCHES",
    "VIT_DIM",
    "F30K_IMAGES",
    "F30K_CAPTIONS",
    "COCO_IMAGES",
    "COCO_CAPTIONS",
    "MAX_DENSE_LEN",
    "DEFAULT_BERT_VOCAB",
    "SCORING_CONFIGS",
    "SCORING_SHAPES",
    "build_bench_matcher",
    "check_bert_vocab",
    "refuse_vocab_without_data",
    "benchmark_lengths",
    "find_shared_data",
    "stand_in_lengths",
    "real_lengths",
    "scoring_inputs",
]

_logger = logging.getLogger(__name__)

# ViT-B/16 at 224 px: 196 patches + CLS, projected to C = 512 (the official SEPS/LAPS setting).
VIT_PATCHES, VIT_DIM = 196, 512
F30K_IMAGES, F30K_CAPTIONS = 1000, 5000
COCO_IMAGES, COCO_CAPTIONS = 5000, 25000
#: The test galleries the scoring benchmarks are quoted at: (images, captions).
SCORING_SHAPES = {"f30k": (F30K_IMAGES, F30K_CAPTIONS), "coco5k": (COCO_IMAGES, COCO_CAPTIONS)}
MAX_DENSE_LEN = 128  # the default data.max_dense_len: the same cap in training and evaluation

#: Benchmark name -> matcher, variant, dense pairing and whether dense text is given; the first is the
#: headline case (official SEPS with the official, caption-tied dense text).
SCORING_CONFIGS: dict[str, dict[str, Any]] = {
    "seps-code-caption": {"name": "seps", "variant": "code", "dense_pairing": "caption", "dense": True},
    "seps-code-image": {"name": "seps", "variant": "code", "dense_pairing": "image", "dense": True},
    "laps": {"name": "laps", "variant": "code", "dense_pairing": "image", "dense": False},
    "seps-paper-image": {"name": "seps", "variant": "paper", "dense_pairing": "image", "dense": True},
    "seps-paper-caption": {"name": "seps", "variant": "paper", "dense_pairing": "caption", "dense": True},
}


def build_bench_matcher(config: str):
    """The seeded, eval-mode matcher of benchmark config ``config`` at ViT-B/16-224 shapes."""
    from patchword.matching import build_matcher

    if config not in SCORING_CONFIGS:
        raise ValueError(f"unknown scoring config {config!r}; choose from {', '.join(SCORING_CONFIGS)}")
    spec = SCORING_CONFIGS[config]
    torch.manual_seed(0)
    return build_matcher(
        spec["name"],
        embed_dim=VIT_DIM,
        num_patches=VIT_PATCHES,
        has_cls=True,
        variant=spec["variant"],
        dense_pairing=spec["dense_pairing"],
    ).eval()


def find_shared_data(path: str | Path | None = None) -> Path | None:
    """The shared data folder (the one holding ``f30k_1k_test``).

    Args:
        path: an explicit folder; it must hold ``f30k_1k_test``. None looks next to the working directory
            and next to the repository (``../shared/data``) and returns None when neither has it.

    Raises:
        MissingFileError: ``path`` is given but has no ``f30k_1k_test``.
    """
    if path is not None:
        folder = Path(path)
        if not (folder / "f30k_1k_test").is_dir():
            raise MissingFileError(f"{folder} has no f30k_1k_test folder (is it the shared data folder?)")
        return folder.resolve()
    repo = Path(__file__).resolve().parents[3]  # src/patchword/bench/inputs.py -> the repository
    for candidate in (Path.cwd().parent / "shared" / "data", repo.parent / "shared" / "data"):
        if (candidate / "f30k_1k_test").is_dir():
            return candidate.resolve()
    return None


def check_bert_vocab(name: str, key: str = "bert_vocab") -> BertCaptionTokenizer:
    """Load the BERT vocabulary ``name`` (a ``vocab.txt``, a tokenizer folder or a cached hub id) once, before
    any work: one the user named must load, where :func:`real_lengths` would fall back to word counts.

    Returns:
        The tokenizer, for :func:`real_lengths` (``tokenizer=``): it is not loaded a second time.

    Raises:
        ConfigError: it does not load; the message names ``key`` (the flag) and why.
    """
    from patchword.data.tokenizers import BertCaptionTokenizer

    try:
        return BertCaptionTokenizer.from_pretrained(name)
    except (PatchwordError, OSError, ValueError) as err:
        if Path(name).expanduser().exists():  # found but unreadable: the reason is the news
            raise ConfigError(key, f"{name}: not a BERT vocabulary that loads: {err}") from err
        # (the hub lookup's own advice names a config key of training runs, not this flag)
        raise ConfigError(
            key, f"{name}: no such file or folder, nor a hub id in the offline Hugging Face cache"
        ) from err


def refuse_vocab_without_data(
    data: str | None, stand_in: bool, key: str = "bert_vocab", stand_in_key: str = "stand_in_lengths"
) -> None:
    """A vocabulary named with no dense captions to count (``stand_in``, or no shared data folder found:
    :func:`benchmark_lengths` takes the stand-in lengths) is refused: it was loaded, then ignored.

    Raises:
        ConfigError: naming ``key`` (the vocabulary's flag) and why it would change nothing.
    """
    if stand_in:
        why = f"{stand_in_key} takes seeded stand-in lengths"
    elif find_shared_data(data) is None:
        why = "no shared data folder was found (../shared/data; --data names one): stand-in lengths are used"
    else:
        return
    raise ConfigError(
        key,
        f"counts the tokens of the shared data folder's dense captions, but {why}: it would change nothing; "
        "drop it",
    )


def stand_in_lengths() -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded log-normal caption (5000, median 15) and dense (1000, median 114, capped) token counts."""
    g = torch.Generator().manual_seed(0)
    caps = (15 * torch.exp(0.25 * torch.randn(F30K_CAPTIONS, generator=g))).round().clamp(5, 80)
    dense = (114 * torch.exp(0.15 * torch.randn(F30K_IMAGES, generator=g))).round().clamp(40, MAX_DENSE_LEN)
    return caps.long(), dense.long()


def real_lengths(
    data: Path | None, bert_vocab: str | None, *, tokenizer: BertCaptionTokenizer | None = None
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Token counts (specials included) of the Flickr30K 1K test captions (5000, image-major) and of the
    SEPS LLaVA dense captions of its 1000 images (capped at ``MAX_DENSE_LEN``), and where they came from.

    Captions: ``test_bert_caps.txt`` already holds their BERT ids. Dense captions: BERT WordPiece with
    ``bert_vocab`` when it loads (offline), otherwise basic tokens (words and punctuation) + 2; ``tokenizer``:
    ``bert_vocab`` already loaded (:func:`check_bert_vocab`). Without the data folder (``data`` None):
    :func:`stand_in_lengths`.
    """
    if data is None:
        caps, dense = stand_in_lengths()
        return caps, dense, "synthetic stand-in (log-normal, medians 15 and 114)"
    bert_caps = data / "f30k_1k_test" / "test_bert_caps.txt"
    caps = [len(line.split(",")) for line in bert_caps.read_text().splitlines() if line.strip()]
    source = f"captions: BERT ids of {bert_caps.name}"
    from patchword.data.textfiles import load_dense_jsonl

    texts = load_dense_jsonl(data / "seps_dense_llava" / "f30k_test.jsonl")
    counts = None
    if bert_vocab:
        try:
            if tokenizer is None:
                from patchword.data.tokenizers import BertCaptionTokenizer

                tokenizer = BertCaptionTokenizer.from_pretrained(bert_vocab)
            counts = [len(tokenizer.encode(text)) for text in texts]
            source += f"; dense: BERT WordPiece ({bert_vocab})"
        except Exception as err:  # noqa: BLE001 - any failure means "no vocabulary here"
            # not the loader's own advice: it names a config key of training runs, which bench does not take
            _logger.debug("BERT vocabulary %s: %s", bert_vocab, err)
            _logger.info(
                "no BERT vocabulary (%s does not load offline): dense lengths from word counts; --bert-vocab "
                "names one (a vocab.txt, a tokenizer folder or a cached hub id)",
                bert_vocab,
            )
    if counts is None:
        counts = [len(re.findall(r"\w+|[^\w\s]", text)) + 2 for text in texts]
        source += "; dense: words + punctuation + 2 (no BERT vocabulary available offline)"
    dense = torch.tensor(counts).clamp(max=MAX_DENSE_LEN)
    return torch.tensor(caps), dense, source + f", dense capped at {MAX_DENSE_LEN}"


def benchmark_lengths(
    data: str | None,
    bert_vocab: str | None,
    *,
    stand_in: bool = False,
    tokenizer: BertCaptionTokenizer | None = None,
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Caption and dense lengths for the benchmark: :func:`stand_in_lengths` when ``stand_in`` or when no
    shared data folder is found (``data`` None), else :func:`real_lengths` of that folder (``tokenizer``:
    ``bert_vocab`` already loaded)."""
    folder = None if stand_in else find_shared_data(data)
    if folder is None and not stand_in:
        _logger.info("no shared data folder found: synthetic stand-in lengths")
    return real_lengths(folder, bert_vocab, tokenizer=tokenizer)


def scoring_inputs(
    n_img: int,
    cap_lens: torch.Tensor,
    dense_lens: torch.Tensor,
    seed: int = 0,
    caption_images: int | None = None,
):
    """Random ViT-224-shaped tokens for the first ``n_img`` images and their dense captions (real
    lengths), and the captions (real lengths) of the first ``caption_images`` of them (default all).

    Returns:
        ``(img (n_img, 197, 512), caps (T, L, 512), cap_lens (T,), dense (n_img, L_d, 512),
        dense_lens (n_img,), txt2img (T,))``; caption j belongs to image ``j // captions_per_image``.
    """
    g = torch.Generator().manual_seed(seed)
    caps_per_image = cap_lens.numel() // dense_lens.numel()
    n_txt = caps_per_image * min(n_img, caption_images or n_img)
    lens = cap_lens[:n_txt].clone()
    dlens = dense_lens[:n_img].clone()
    img = torch.randn(n_img, VIT_PATCHES + 1, VIT_DIM, generator=g)
    caps = torch.randn(n_txt, int(lens.max()), VIT_DIM, generator=g)
    dense = torch.randn(n_img, int(dlens.max()), VIT_DIM, generator=g)
    return img, caps, lens, dense, dlens, torch.arange(n_txt) // caps_per_image
