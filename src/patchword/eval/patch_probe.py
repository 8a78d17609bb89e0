"""Do the image encoder's patch tokens say what is under them? Linear probes on frozen patch tokens.

Patch selection (SEPS / LAPS) keeps the patches whose tokens score highest for a caption; it can only find
the objects when a patch token carries what the patch shows. Real backbones (ViT pretrained on ImageNet
classification, CLIP, Swin) do: a linear read-out of a single patch token recovers its content. This module
measures the same of any image encoder on the synthetic scenes, whose generator knows every pixel:

* ``object``: is the patch mostly (>= half its pixels) covered by an object, or background? (2 classes)
* ``shape`` and ``colour``: of the object covering an object patch (5 and 8 classes).

Each probe is a multinomial logistic regression (float64, L-BFGS, L2-regularised) fitted on the patch
tokens of training images and scored on test images. Next to its accuracy it reports the two chance
levels: the majority class's share (what always answering the commonest class scores) and ``1 / K``
(what balanced accuracy, the mean of the per-class recalls, is at chance). The share of pixels that
objects cover says how much of an image a global vector averages over.

A linear probe may find what no selection score uses (on these flat-coloured scenes a patch's colour is in
its pixels, so even a randomly initialised encoder's tokens give it away). Patch selection ranks patches by
their similarity to the caption's words in the joint space, so :func:`patch_word_grounding` measures that
directly, with no probe: for each colour and shape word, how well the cosine between a patch token and the
word's token separates the patches of objects with that attribute from all other patches (ROC AUC, chance
50).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from patchword._validation import check_finite
from patchword.eval.scoring import eval_mode

__all__ = [
    "ProbeScore",
    "fit_linear_probe",
    "patch_targets",
    "probe_patch_tokens",
    "patch_word_grounding",
    "roc_auc",
    "synthetic_patch_probe",
]

#: A patch is an object patch when at least this share of its pixels belongs to an object.
OBJECT_COVERAGE = 0.5


#: Why NaN / inf features or scores are refused (``check_finite``'s ``why``): a NaN token makes the probe
#: predict one class (accuracy = the majority chance) and every AUC 50, numbers that look like an encoder
#: that learned nothing.
_NOT_FINITE = "no probe or AUC can be computed from them"

#: The probes' L2 weight decay (per training sample) and L-BFGS iterations.
_L2, _MAX_ITER = 1e-4, 200


@dataclass(frozen=True)
class ProbeScore:
    """Test accuracy of one linear probe (%), with its chance levels (%) and sample counts."""

    accuracy: float
    balanced_accuracy: float
    majority_chance: float
    balanced_chance: float
    classes: int
    train_samples: int
    test_samples: int

    def as_dict(self) -> dict[str, float | int]:
        return dict(self.__dict__)


def fit_linear_probe(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    test_x: torch.Tensor,
    test_y: torch.Tensor,
    *,
    l2: float = _L2,
    max_iter: int = _MAX_ITER,
) -> ProbeScore:
    """Fit a multinomial logistic regression on (train_x, train_y), score it on (test_x, test_y).

    Args:
        train_x, test_x: (M, C) features; standardised with the training mean and std.
        train_y, test_y: (M,) int64 class ids in ``0 .. K-1`` (K from the training labels).
        l2: weight decay on the weights (not the bias), per training sample.
        max_iter: L-BFGS iterations.
    Returns:
        :class:`ProbeScore` (float64 throughout: the same numbers on any CPU up to rounding).
    Raises:
        ValueError: no samples, or a feature that is NaN or infinite.
    """
    if train_x.shape[0] == 0 or test_x.shape[0] == 0:
        raise ValueError("the probe needs training and test samples")
    check_finite(train_x, "the probe's training features", why=_NOT_FINITE)
    check_finite(test_x, "the probe's test features", why=_NOT_FINITE)
    return _fit_probe(train_x, train_y, test_x, test_y, l2, max_iter)


def _fit_probe(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    test_x: torch.Tensor,
    test_y: torch.Tensor,
    l2: float = _L2,
    max_iter: int = _MAX_ITER,
) -> ProbeScore:
    """:func:`fit_linear_probe` on features already checked (samples on both sides, all finite)."""
    x = train_x.double()
    mean, std = x.mean(0), x.std(0).clamp_min(1e-8)
    x = (x - mean) / std
    xt = (test_x.double() - mean) / std
    y, yt = train_y.long(), test_y.long()
    k = int(max(int(y.max()), int(yt.max())) + 1)
    weight = torch.zeros(x.shape[1], k, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(k, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weight, bias], lr=1.0, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ weight + bias, y) + l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        predicted = (xt @ weight + bias).argmax(1)
    correct = predicted == yt
    present = [c for c in range(k) if bool((yt == c).any())]
    recalls = [float(correct[yt == c].double().mean()) for c in present]
    counts = torch.bincount(yt, minlength=k)
    return ProbeScore(
        accuracy=100.0 * float(correct.double().mean()),
        balanced_accuracy=100.0 * sum(recalls) / len(recalls),
        majority_chance=100.0 * float(counts.max()) / len(yt),
        balanced_chance=100.0 / len(present),
        classes=len(present),
        train_samples=int(x.shape[0]),
        test_samples=int(xt.shape[0]),
    )


def patch_targets(labels: np.ndarray, scenes, grid: int) -> dict[str, np.ndarray]:
    """Per-patch ground truth of a ``grid x grid`` patch grid from the generator's pixel labels.

    Args:
        labels: (N, H, W) int8, the cell of the object covering each pixel or -1
            (:func:`patchword.data.synthetic.object_label_map`); H and W multiples of ``grid``.
        scenes: the split's :class:`~patchword.data.synthetic.SceneTable` (attributes per cell).
        grid: patches per side.
    Returns:
        ``coverage`` (N, P) float share of each patch's pixels covered by objects, ``object`` (N, P) bool
        (coverage >= :data:`OBJECT_COVERAGE`), ``shape`` and ``colour`` (N, P) int64 of the object covering
        most of the patch (-1 for background patches), P = grid * grid in ViT token order.
    """
    n, height, width = labels.shape
    if height % grid or width % grid:
        raise ValueError(f"a {height}x{width} image does not split into a {grid}x{grid} patch grid")
    ph, pw = height // grid, width // grid
    blocks = labels.reshape(n, grid, ph, grid, pw).transpose(0, 1, 3, 2, 4).reshape(n, grid * grid, ph * pw)
    covered = blocks >= 0
    coverage = covered.mean(-1)
    # the cell covering most of each patch (objects never overlap, so a patch holds one or two objects)
    counts = np.stack([(blocks == cell).sum(-1) for cell in range(9)], -1)  # (N, P, 9)
    cell = counts.argmax(-1)
    is_object = coverage >= OBJECT_COVERAGE
    rows = np.arange(n)[:, None]
    shape = np.where(is_object, scenes.shape[rows, cell], -1).astype(np.int64)
    colour = np.where(is_object, scenes.colour[rows, cell], -1).astype(np.int64)
    return {"coverage": coverage, "object": is_object, "shape": shape, "colour": colour}


def probe_patch_tokens(
    train_tokens: torch.Tensor,
    train_targets: dict[str, np.ndarray],
    test_tokens: torch.Tensor,
    test_targets: dict[str, np.ndarray],
    *,
    max_train_samples: int = 60_000,
    seed: int = 0,
) -> dict[str, dict[str, float | int]]:
    """The ``object``, ``shape`` and ``colour`` probes on patch tokens.

    Args:
        train_tokens, test_tokens: (N, P, C) patch tokens (no CLS), in the targets' patch order.
        train_targets, test_targets: :func:`patch_targets` of the same images.
        max_train_samples: patches drawn (seeded) to fit each probe.
    Returns:
        ``{probe: ProbeScore.as_dict()}``; None for a probe with fewer than two classes in its data (no
        object patch at all: objects smaller than half a patch).
    Raises:
        ValueError: a patch token holds NaN or inf.
    """
    # checked once here: every probe fits on these tokens (a subset of them), unchecked again
    check_finite(train_tokens, "the image encoder's patch tokens of the training images", why=_NOT_FINITE)
    check_finite(test_tokens, "the image encoder's patch tokens of the test images", why=_NOT_FINITE)
    gen = torch.Generator().manual_seed(seed)
    all_xs = train_tokens.reshape(-1, train_tokens.shape[-1])
    all_xt = test_tokens.reshape(-1, test_tokens.shape[-1])
    out = {}
    for task in ("object", "shape", "colour"):
        ys, yt = (torch.as_tensor(t[task]).long().flatten() for t in (train_targets, test_targets))
        xs, xt = all_xs, all_xt
        if task != "object":  # attributes of object patches only
            keep_s, keep_t = ys >= 0, yt >= 0
            xs, ys, xt, yt = xs[keep_s], ys[keep_s], xt[keep_t], yt[keep_t]
        if len(ys) > max_train_samples:
            pick = torch.randperm(len(ys), generator=gen)[:max_train_samples]
            xs, ys = xs[pick], ys[pick]
        # None: nothing to tell apart (no object patch at all: objects smaller than half a patch)
        ok = len(ys) and len(yt) and len(torch.unique(ys)) > 1 and len(torch.unique(yt)) > 1
        out[task] = _fit_probe(xs, ys, xt, yt).as_dict() if ok else None
    return out


def roc_auc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """Area under the ROC curve (%) of ``scores`` (M,) for the bool labels ``positive`` (M,): the chance that
    a random positive outscores a random negative (ties count half).

    Raises:
        ValueError: no positive or no negative, or a NaN / infinite score (NaN sorts anywhere: the AUC
            of a NaN-scored set came out near 50, a plausible chance level).
    """
    scores = scores.double().flatten()
    check_finite(scores, "the AUC's scores", why=_NOT_FINITE)
    return _roc_auc(scores, positive)


def _roc_auc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """:func:`roc_auc` of (M,) float64 scores already checked finite."""
    positive = positive.bool().flatten()
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("the AUC needs positives and negatives")
    order = scores.argsort()
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    sorted_scores = scores[order]  # average the ranks of tied scores
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    ranks[order] = ((ends - counts.double() + 1 + ends) / 2)[inverse]
    u = float(ranks[positive].sum()) - n_pos * (n_pos + 1) / 2
    return 100.0 * u / (n_pos * n_neg)


@torch.no_grad()
def patch_word_grounding(
    model,
    tokenizer,
    patch_tokens: torch.Tensor,
    targets: dict[str, np.ndarray],
    synthetic_config,
    device="cpu",
) -> dict[str, float]:
    """How well a patch token's cosine with a word's token finds the patches of objects with that word.

    Each attribute word (every colour and shape of ``synthetic_config``) is encoded alone as a caption; its
    token (after the text encoder) is compared with every patch token by cosine. Per word, the ROC AUC of
    the object patches having that attribute against every other patch; averaged over the words.

    Args:
        patch_tokens: (N, P, C) the image encoder's patch tokens.
        targets: :func:`patch_targets` of the same images.
    Returns:
        ``{"colour_auc", "shape_auc"}`` (%, chance 50; None when no patch is an object patch).
    Raises:
        ValueError: a patch or word token holds NaN or inf.
    """
    # checked once: a cosine of finite unit vectors is finite, so no word's scores are checked again
    check_finite(patch_tokens, "the patch tokens", why=_NOT_FINITE)
    tokens = torch.nn.functional.normalize(patch_tokens.double().reshape(-1, patch_tokens.shape[-1]), dim=-1)
    out = {}
    for task, words in (("colour", synthetic_config.colours), ("shape", synthetic_config.shapes)):
        labels = torch.as_tensor(targets[task]).flatten()
        ids, lens = tokenizer.batch_encode(list(words))
        encoded = model.encode_texts(ids.to(device), lens.to(device)).double().cpu()
        check_finite(encoded[:, 1], f"the text encoder's {task} word tokens", why=_NOT_FINITE)
        aucs = []
        for k, _ in enumerate(words):
            positive = labels == k
            if not bool(positive.any()):
                continue
            # the word's token: position 1, after <start> (one word, no context to mix in)
            word = torch.nn.functional.normalize(encoded[k, 1], dim=0)
            aucs.append(_roc_auc(tokens @ word, positive))
        out[f"{task}_auc"] = sum(aucs) / len(aucs) if aucs else None  # None: no object patch
    return out


@torch.no_grad()
def _patch_tokens(model, images: np.ndarray, device, block: int = 64) -> torch.Tensor:
    """(N, P, C) float32 patch tokens (CLS dropped) of (N, H, W, 3) uint8 images, preprocessed as the
    synthetic pipeline does (:class:`~patchword.data.pipeline.ArrayImages`)."""
    from patchword.data.pipeline import ArrayImages

    source, encoder = ArrayImages(images), model.image_encoder
    parts = []
    for i0 in range(0, len(source), block):
        rows = torch.arange(i0, min(i0 + block, len(source)))
        tokens = model.encode_images(source.batch(rows, train=False).to(device))
        parts.append(tokens[:, int(encoder.has_cls) :].float().cpu())
    return torch.cat(parts)


def synthetic_patch_probe(
    model,
    synthetic_config,
    tokenizer=None,
    *,
    cache_dir: str | None = None,
    num_train: int = 1000,
    num_test: int = 1000,
    device: torch.device | str = "cpu",
) -> dict[str, object]:
    """Probe ``model``'s image encoder on the scenes of ``synthetic_config``: fitted on the first
    ``num_train`` images of the generator's train split, scored on the first ``num_test`` test images.

    Returns:
        ``{"object" | "shape" | "colour": ProbeScore dict, "grounding": patch_word_grounding (with a
        ``tokenizer``), "object_pixel_share": % of the test images' pixels that objects cover,
        "object_patch_share": % of their patches that are object patches (>= half covered),
        "object_touched_share": % touched by an object at all (the selection metrics' object patches),
        "images": {"train": n, "test": n}}``.
    """
    from patchword.data.synthetic import SyntheticScenes, object_label_map, split_layout

    encoder = model.image_encoder
    grid = math.isqrt(encoder.num_patches)
    syn = synthetic_config
    if grid * grid != encoder.num_patches or encoder.image_size != syn.image_size:
        raise ValueError(
            f"the probe needs the encoder to see the generator's {syn.image_size}-pixel images on a square "
            f"patch grid (it takes {encoder.image_size} pixels, {encoder.num_patches} patches)"
        )
    scenes = SyntheticScenes.load_or_generate(syn, cache_dir=cache_dir)
    with eval_mode(model):
        tokens, targets = {}, {}
        for name, count in (("train", num_train), ("test", num_test)):
            part = scenes[name]
            count = min(count, len(part.images))
            labels = object_label_map(part.scenes, syn, split_layout(syn, name, part.scenes))[:count]
            targets[name] = patch_targets(labels, part.scenes, grid)
            tokens[name] = _patch_tokens(model, part.images[:count], device)
        result: dict[str, object] = dict(
            probe_patch_tokens(tokens["train"], targets["train"], tokens["test"], targets["test"])
        )
        if tokenizer is not None:
            result["grounding"] = patch_word_grounding(
                model, tokenizer, tokens["test"], targets["test"], syn, device
            )
    test = targets["test"]
    result["object_pixel_share"] = 100.0 * float(test["coverage"].mean())
    result["object_patch_share"] = 100.0 * float(test["object"].mean())
    result["object_touched_share"] = 100.0 * float((test["coverage"] > 0).mean())
    result["images"] = {"train": int(tokens["train"].shape[0]), "test": int(tokens["test"].shape[0])}
    return result


def format_probe_table(result: dict) -> str:
    """The probes, grounding and object shares of :func:`synthetic_patch_probe` as a Markdown table."""
    lines = [
        "| probe | accuracy | balanced accuracy | chance (majority / 1/K) | test patches |",
        "|---|---|---|---|---|",
    ]
    for task in ("object", "shape", "colour"):
        r = result[task]
        if r is None:
            lines.append(f"| {task} | no object patch | | | 0 |")
            continue
        lines.append(
            f"| {task} | {r['accuracy']:.1f} | {r['balanced_accuracy']:.1f} | "
            f"{r['majority_chance']:.1f} / {r['balanced_chance']:.1f} | {r['test_samples']} |"
        )
    grounding = result.get("grounding")
    if grounding and None not in grounding.values():
        lines.append(
            f"\npatch-word grounding (ROC AUC, chance 50): colour words {grounding['colour_auc']:.1f}, "
            f"shape words {grounding['shape_auc']:.1f}"
        )
    pixels, half, touched = (
        result[k] for k in ("object_pixel_share", "object_patch_share", "object_touched_share")
    )
    lines.append(
        f"objects cover {pixels:.1f}% of the pixels; {half:.1f}% of the patches are at least half object, "
        f"{touched:.1f}% touch one"
    )
    return "\n".join(lines)
