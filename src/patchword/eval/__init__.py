"""Evaluation: retrieval metrics, exact fast scoring, two-stage search, and model evaluation on a split."""

from patchword.eval.coco_extended import coco_extended_metrics
from patchword.eval.config import EvalConfig
from patchword.eval.engine import ScoringEngine, score_matrix
from patchword.eval.metrics import RECALL_KS, coco_1k_folds, retrieval_metrics, retrieval_ranks
from patchword.eval.protocol import ensemble_metrics, evaluate, score_split
from patchword.eval.scoring import encode_image_tokens, encode_text_tokens
from patchword.eval.two_stage import GlobalIndex, TwoStageResult, global_embeddings, two_stage_scores

__all__ = [
    "EvalConfig",
    "GlobalIndex",
    "RECALL_KS",
    "ScoringEngine",
    "TwoStageResult",
    "coco_1k_folds",
    "coco_extended_metrics",
    "encode_image_tokens",
    "encode_text_tokens",
    "ensemble_metrics",
    "evaluate",
    "global_embeddings",
    "retrieval_metrics",
    "retrieval_ranks",
    "score_matrix",
    "score_split",
    "two_stage_scores",
]
