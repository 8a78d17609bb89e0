"""patchword: fine-grained image-text retrieval in PyTorch.

Data flows one way: dataset -> encoders -> token tensors -> matcher -> similarities -> loss | metrics.

``create_model("seps-vit-b16-code")`` builds a named architecture (:func:`list_models`),
``create_model_and_transforms`` also its tokenizer and image preprocessing;
``patchword.matching.build_matcher`` a similarity head alone; ``patchword.runs.load_run`` a trained run.
"""

from patchword.factory import (
    create_model,
    create_model_and_transforms,
    get_model_config,
    list_models,
)
from patchword.version import __version__

__all__ = ["__version__", "create_model", "create_model_and_transforms", "get_model_config", "list_models"]
