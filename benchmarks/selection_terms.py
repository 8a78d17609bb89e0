"""Which term of SEPS's selection score points at the objects? Object recall of each term's top-K.

SEPS keeps the K patches with the highest score, a mix of image saliency s_im (cosine with the mean patch
in the official code, or with CLS), text relevance s_st / s_dt (cosine with the caption's / dense
caption's mean word) and, in the paper variant, a learned score s_p. On the synthetic scenes the
generator knows which patches the objects cover, so each term can be scored on its own: the share of
object patches among its top-K (``recall``), against K/N (``chance``, a random selection), and the same
for its bottom-K (a term that points *away* from the objects has a high bottom-K recall).

    python benchmarks/selection_terms.py runs/demo [--images 300] [--checkpoint best.pt]
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from patchword.data.prepare import prepare_data
from patchword.data.synthetic import SyntheticScenes, split_object_patches
from patchword.matching.ops import l2norm, masked_mean
from patchword.matching.selection import combine_paper_scores, image_saliency, text_relevance
from patchword.matching.seps import _ImageCache
from patchword.runs import load_run


def _recall(score: torch.Tensor, masks: torch.Tensor, k: int, largest: bool) -> float:
    """Pooled share (%) of object patches among the top-K (or bottom-K) patches of ``score`` (P, N)."""
    idx = score.topk(k, dim=-1, largest=largest).indices
    keep = torch.zeros_like(masks).scatter_(-1, idx, True)
    return 100.0 * float((keep & masks).sum()) / float(masks.sum())


@torch.no_grad()
def selection_terms(run_dir: str, checkpoint: str | None, images: int) -> dict[str, dict[str, float]]:
    loaded = load_run(run_dir, checkpoint)
    model, cfg = loaded.model.eval(), loaded.config
    matcher = model.matcher
    data = prepare_data(cfg.data, loaded.tokenizer, roles=["test"], use_dense=True)
    split = data.splits["test"]
    syn = cfg.data.synthetic_config()
    scenes = SyntheticScenes.load_or_generate(syn, cache_dir=cfg.data.cache_dir or None)["test"].scenes
    n = model.image_encoder.num_patches
    masks = torch.as_tensor(split_object_patches(scenes, syn, "test", math.isqrt(n)).any(1))[:images]
    rows = torch.arange(images)
    cols = torch.stack([(split.txt2img == i).nonzero()[0, 0] for i in range(images)])  # first caption
    img_tokens = model.encode_images(split.images.batch(rows, train=False))
    width = int(split.cap_lens[cols].max())
    cap = model.encode_texts(split.cap_ids[cols, :width], split.cap_lens[cols])
    dlens = split.dense_lens[rows]
    dense = model.encode_texts(split.dense_ids[rows, : int(dlens.max())], dlens)

    cache = _ImageCache.build(matcher, img_tokens)
    patches = img_tokens[:, 1:]
    unit = cache.patches_unit
    terms = {
        "s_im, mean patch (official)": image_saliency(patches, unit),
        "s_im, CLS": image_saliency(patches, unit, img_tokens[:, 0]),
        "s_st, caption (own)": text_relevance(unit, l2norm(masked_mean(cap, split.cap_lens[cols])), True)[
            :, 0
        ],
        "s_dt, dense caption (own)": text_relevance(unit, l2norm(masked_mean(dense, dlens)), True)[:, 0],
        "patch norm": patches.norm(dim=-1),
    }
    if cache.predicted is not None:
        terms["s_p, learned predictor"] = cache.predicted
        terms["paper score, caption branch (as used)"] = combine_paper_scores(
            cache.predicted, cache.saliency, [terms["s_st, caption (own)"][:, None]], matcher.config.beta
        )[:, 0]
    k = matcher.num_keep
    out = {
        name: {
            "top_k_recall": _recall(score, masks, k, True),
            "bottom_k_recall": _recall(score, masks, k, False),
            "chance": 100.0 * k / n,
        }
        for name, score in terms.items()
    }
    out["_"] = {"object_share_of_patches": 100.0 * float(masks.float().mean()), "k": k, "n": n}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--images", type=int, default=300)
    args = parser.parse_args()
    result = selection_terms(args.run_dir, args.checkpoint, args.images)
    print("| term | object recall of its top-K (%) | of its bottom-K (%) | chance (%) |")
    print("|---|---|---|---|")
    for name, r in result.items():
        if name != "_":
            print(f"| {name} | {r['top_k_recall']:.1f} | {r['bottom_k_recall']:.1f} | {r['chance']:.1f} |")
    print(json.dumps(result["_"]))


if __name__ == "__main__":
    main()
