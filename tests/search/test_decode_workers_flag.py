"""A negative count of decoding threads is refused by one check, naming ``--decode-workers`` (the flag the
docs list) from the library and whichever spelling the command line gave (old code: the library named the
hidden alias ``--workers``, the CLI repeated the check to name the other)."""

from __future__ import annotations

import pytest

from patchword.cli.search import main_index
from patchword.errors import ConfigError
from patchword.search.index import build_index

MESSAGE = "must be 0 (the default: min(4, CPUs)) or more, got -1"


def test_the_library_names_decode_workers(env, tmp_path):
    with pytest.raises(ConfigError) as err:
        build_index(env.run, env.export.files["images"], tmp_path / "idx", workers=-1)
    assert (err.value.key, err.value.detail) == ("--decode-workers", MESSAGE)
    assert not (tmp_path / "idx").exists()


@pytest.mark.parametrize("flag", ["--decode-workers", "--workers"])
def test_the_command_line_names_the_spelling_given(env, tmp_path, capsys, flag):
    argv = [
        "build",
        str(env.run_dir),
        "--images",
        str(env.export.files["images"]),
        "--out",
        str(tmp_path / "i"),
    ]
    assert main_index([*argv, flag, "-1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {flag}: {MESSAGE}"]
    assert not (tmp_path / "i").exists()
