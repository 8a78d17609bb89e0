"""Oracle recall: the best recall any model can expect on a benchmark with ambiguous captions."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def oracle_metrics(
    fits: np.ndarray | None, txt2img: np.ndarray, ks: Sequence[int] = (1, 5, 10)
) -> dict[str, float | None]:
    """Expected recall (percent) of an oracle that ranks every fitting item first, in random order.

    The bound any model can expect on a benchmark whose captions are ambiguous: a model that knows the
    fits relation perfectly still has to guess among the items that fit equally well.

    Text-to-image, a caption fitting n images: P(GT in top K) = min(K, n) / n.
    Image-to-text, an image fitting n_f captions, g of them its own: P(some GT in top K)
    = 1 - C(n_f - g, K) / C(n_f, K) = 1 - prod_{i<K} (n_f - g - i) / (n_f - i), which is exact
    and needs no large binomials (a factor hits 0 as soon as K > n_f - g).

    Args:
        fits: (N_txt, N_img) bool; must contain every ground-truth pair. None: the split's matrix was not
            built (a synthetic train split's, :meth:`~patchword.data.synthetic.SceneSplit.to_retrieval_split`,
            which ``data.test_split=train`` evaluates): no bound, every figure None.
        txt2img: (N_txt,) ground-truth image of each caption.
        ks: recall cut-offs.
    Returns:
        ``{"i2t_r1", "i2t_r5", ..., "t2i_r10", "rsum"}``.
    """
    if fits is None:
        return {**{f"{d}_r{k}": None for d in ("i2t", "t2i") for k in ks}, "rsum": None}
    fits = np.asarray(fits, bool)
    txt2img = np.asarray(txt2img, np.int64)
    n_txt, n_img = fits.shape
    if txt2img.shape != (n_txt,):
        raise ValueError(f"txt2img has shape {txt2img.shape}, expected ({n_txt},)")
    if not fits[np.arange(n_txt), txt2img].all():
        raise ValueError("fits must contain every ground-truth (caption, image) pair")
    n_fit_img = fits.sum(1).astype(np.float64)  # (N_txt,)
    n_fit_txt = fits.sum(0).astype(np.float64)  # (N_img,)
    n_gt = np.bincount(txt2img, minlength=n_img).astype(np.float64)  # (N_img,)
    out: dict[str, float] = {}
    for k in ks:
        miss = np.ones(n_img)  # P(no GT caption in the top k)
        for i in range(k):
            den = n_fit_txt - i
            miss *= np.where(den > 0, np.maximum(n_fit_txt - n_gt - i, 0) / np.maximum(den, 1), 0.0)
        # An image without captions has nothing to retrieve: recall 0, not 1.
        out[f"i2t_r{k}"] = 100.0 * float(np.where(n_gt > 0, 1.0 - miss, 0.0).mean())
    for k in ks:
        out[f"t2i_r{k}"] = 100.0 * float((np.minimum(k, n_fit_img) / n_fit_img).mean())
    out["rsum"] = sum(out.values())
    return out
