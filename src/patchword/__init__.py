"""patchword: fine-grained image-text retrieval in PyTorch.

Data flows one way: dataset -> encoders -> token tensors -> matcher -> similarities -> loss | metrics.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
