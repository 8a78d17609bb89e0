"""Importer of the official seps checkpoints (see patchword.imports.base)."""
