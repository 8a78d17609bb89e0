"""Importer of the official ucmfh checkpoints (see patchword.imports.base)."""
