"""Scoring engines: the exact full similarity matrix of a matcher, fast and in bounded memory.

``score_matrix`` is the entry point (:mod:`patchword.eval.engine.core`, the dispatcher); the engine
protocol and the types every engine shares are in :mod:`patchword.eval.engine.base`;
:mod:`patchword.eval.engine.seps` is the SEPS/LAPS reformulation.
"""

from patchword.eval.engine.base import DEFAULT_MAX_MEMORY_MB, BlockPlan, ScoringEngine, ScoringInputs
from patchword.eval.engine.core import engine_for, score_matrix
from patchword.eval.engine.forward import ForwardEngine
from patchword.eval.engine.memory import TensorMemoryMeter
from patchword.eval.engine.seps import SEPSEngine
from patchword.eval.engine.tgdt import TGDTEngine
from patchword.eval.engine.vse import VSEEngine

__all__ = [
    "DEFAULT_MAX_MEMORY_MB",
    "BlockPlan",
    "ForwardEngine",
    "SEPSEngine",
    "ScoringEngine",
    "ScoringInputs",
    "TGDTEngine",
    "TensorMemoryMeter",
    "VSEEngine",
    "engine_for",
    "score_matrix",
]
