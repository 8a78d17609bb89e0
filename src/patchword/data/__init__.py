"""Datasets: the synthetic scenes default, real caption files, and the canonical retrieval split."""
