"""Evaluation: retrieval metrics, chunked scoring, and model evaluation on a split."""

from patchword.eval.metrics import RECALL_KS, coco_1k_folds, retrieval_metrics, retrieval_ranks
from patchword.eval.scoring import chunked_scores, encode_image_tokens, encode_text_tokens

__all__ = [
    "RECALL_KS",
    "chunked_scores",
    "coco_1k_folds",
    "encode_image_tokens",
    "encode_text_tokens",
    "retrieval_metrics",
    "retrieval_ranks",
]
