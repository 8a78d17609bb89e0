"""The version of patchword, recorded in every file it writes (exports, evaluations): a module of its own
so those writers need not import the package's public API (``patchword/__init__`` imports the factory)."""

# keep equal to pyproject.toml's [project] version (tests/project/test_layout.py checks)
__version__ = "0.1.0"
