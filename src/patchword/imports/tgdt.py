"""Importer of the official tgdt checkpoints (see patchword.imports.base)."""
