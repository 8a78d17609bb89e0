"""Evaluation: retrieval metrics (Recall@K, median/mean rank) and the COCO 1K fold protocol."""

from patchword.eval.metrics import RECALL_KS, coco_1k_folds, retrieval_metrics, retrieval_ranks

__all__ = ["RECALL_KS", "coco_1k_folds", "retrieval_metrics", "retrieval_ranks"]
