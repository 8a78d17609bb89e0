"""Importer of the official scan_naaf checkpoints (see patchword.imports.base)."""
