"""One wording for a file the user names that is a directory or is not there: every reader says
"{what} {path} is a directory, not a file" / "{what} {path} does not exist" through
:func:`patchword.readers.require_file` (they used to word it eight ways: "not found: X", "X does not exist"
with no kind, "not a YAML file", "not a gallery JSON file"...)."""

from __future__ import annotations

import re

import pytest

from patchword.errors import MissingFileError


def test_require_file_tells_a_directory_from_a_missing_file_and_appends_the_hint(tmp_path):
    from patchword.readers import require_file

    (tmp_path / "adir").mkdir()
    (tmp_path / "f.json").write_text("{}")
    require_file(tmp_path / "f.json", "summary")  # a file: nothing raised
    require_file(str(tmp_path / "f.json"), "summary")  # a str path too
    with pytest.raises(MissingFileError) as err:
        require_file(tmp_path / "adir", "summary")
    assert str(err.value) == f"summary {tmp_path / 'adir'} is a directory, not a file"
    with pytest.raises(MissingFileError) as err:
        require_file(tmp_path / "nope.json", "summary")
    assert str(err.value) == f"summary {tmp_path / 'nope.json'} does not exist"
    with pytest.raises(FileNotFoundError) as err:  # MissingFileError is one: library callers catch that
        require_file(tmp_path / "adir", "--gallery", hint="--gallery names a gallery JSON file")
    assert str(err.value) == (
        f"--gallery {tmp_path / 'adir'} is a directory, not a file: --gallery names a gallery JSON file"
    )
    with pytest.raises(MissingFileError) as err:
        require_file(tmp_path / "nope", "shard file", hint="merge joins densify output files")
    assert (
        str(err.value) == f"shard file {tmp_path / 'nope'} does not exist: merge joins densify output files"
    )


def _readers(tmp_path):
    """Each reader of a file the user names, with the ``what`` its message starts with."""
    from patchword.config import load_config
    from patchword.densify.shards import _read_shard
    from patchword.densify.stats import read_texts
    from patchword.eval.compositional import _sugarcrepe_records
    from patchword.hashing.readers import load_split, read_mat, read_npy
    from patchword.imports.scan_naaf import read_official_vocab
    from patchword.runs.config import RunConfig, recipe_path
    from patchword.runs.load import resolve_checkpoint

    return {
        "config file": lambda p: load_config(RunConfig, p),
        "config file ": recipe_path,  # the recipe lookup of --config (a trailing space: another key)
        "shard file": _read_shard,
        "dense caption file": read_texts,
        "SugarCrepe file": _sugarcrepe_records,
        ".npy file": read_npy,
        "split file": load_split,
        ".mat file": read_mat,
        "--vocab": read_official_vocab,
        "checkpoint": lambda p: resolve_checkpoint(tmp_path, p),
    }


@pytest.mark.parametrize("state", ["a directory", "missing"])
def test_every_reader_of_a_named_file_says_it_in_the_same_words(tmp_path, state):
    """Old code: "shard file not found: X", "dense caption file not found: X" (a bare FileNotFoundError),
    "X is a directory, not a file" naming no kind of file (hashing), "vocabulary X does not exist" beside
    "--vocab X is a directory, not a vocabulary file"."""
    path = tmp_path / "named"
    if state == "a directory":
        path.mkdir()
    words = "is a directory, not a file" if state == "a directory" else "does not exist"
    for what, read in _readers(tmp_path).items():
        with pytest.raises(MissingFileError) as err:
            read(path)
        assert re.match(
            rf"{re.escape(what.strip())} {re.escape(str(path))} {words}(: .+)?$", str(err.value)
        ), (
            what,
            str(err.value),
        )
