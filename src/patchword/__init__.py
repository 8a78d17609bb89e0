"""patchword: fine-grained image-text retrieval in PyTorch.

Data flows one way: dataset -> encoders -> token tensors -> matcher -> similarities -> loss | metrics.

``create_model("seps-vit-b16-code")`` builds a named architecture (:func:`list_models`),
``create_model_and_transforms`` also its tokenizer and image preprocessing;
``patchword.matching.build_matcher`` a similarity head alone; ``patchword.runs.load_run`` a trained run.

The model functions are imported on first use (PEP 562): ``import patchword.cli`` (the ``patchword``
command) imports no torch, so that a Ctrl-C during ``import torch`` reaches the command's handler.
"""

from typing import TYPE_CHECKING

from patchword.version import __version__

if TYPE_CHECKING:
    from patchword.factory import create_model, create_model_and_transforms, get_model_config, list_models

__all__ = ["__version__", "create_model", "create_model_and_transforms", "get_model_config", "list_models"]


def __getattr__(name: str):
    if name in __all__:
        from patchword import factory

        return getattr(factory, name)
    raise AttributeError(f"module 'patchword' has no attribute {name!r}")
