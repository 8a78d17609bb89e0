"""The command line as scripts use it: a closed output pipe (``| head -1``) ends a command quietly with exit
code 141, as git does; ``-v`` is taken after any verb or sub-verb and turns on debug logging; an unknown
``--split dev`` that is a config key is answered with the override to write; ``--version``."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys

import pytest

from conftest import TINY_MODEL_32, one_error_line
from patchword.cli import main

# `data check` of 4 / 2 / 2 tiny synthetic scenes: a verb that goes through run_command, in a second
TINY_CHECK = ["data", "check", *TINY_MODEL_32, "data.num_train=4", "data.num_dev=2", "data.num_test=2"]


class _ClosedPipe:
    """A standard output whose reader went away: every write raises as a closed pipe's does."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def flush(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _restore_logging():
    """``setup_logging`` sets the root logger's level: give the next tests the level they had."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


@pytest.mark.parametrize("verbose", [[], ["-v"]], ids=["quiet", "verbose"])
def test_a_closed_output_pipe_exits_141_without_an_error_line(verbose, monkeypatch, capsys):
    """Defect: ``patchword ... | head -1`` printed ``error: Broken pipe (EPIPE)`` and exited 2 after a
    successful run (run_command took BrokenPipeError for any OSError). -v adds the traceback only."""
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main([*TINY_CHECK, *verbose]) == 141
    err = capsys.readouterr().err
    assert "error:" not in err
    assert ("Traceback" in err and "BrokenPipeError" in err) == bool(verbose), err


def test_another_broken_pipe_is_still_reported(tmp_path, monkeypatch, capsys):
    """A BrokenPipeError while standard output is a file is another pipe breaking (a socket, a worker):
    still one ``error:`` line and exit code 2, not a quiet exit."""
    from patchword.errors import run_command

    def fails():
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    with open(tmp_path / "out.txt", "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert run_command(fails) == 2
    assert one_error_line(capsys.readouterr().err) == "error: Broken pipe (EPIPE)"


def test_a_real_closed_pipe_in_a_subprocess_exits_141_quietly(tmp_path):
    """The same with a real pipe whose read end is closed before the command starts (``| head -c0``
    without the race): the text left in the buffer once the verb returns fails too, at the flush, and
    must not come back as Python's ``Exception ignored ... BrokenPipeError`` (exit 120) at exit."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "patchword", *TINY_CHECK],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=120,
        )
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr
    assert "error:" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["data", "check", "-v", "data.num_train=abc"],
        ["data", "check", "data.num_train=abc", "--verbose"],
        ["data", "-v", "check", "data.num_train=abc"],
        ["-v", "data", "check", "data.num_train=abc"],
        ["data", "export", "synthetic", "-v", "--out", "OUT", "data.num_test=abc"],
    ],
    ids=["check -v", "check --verbose last", "data -v check", "-v data", "export synthetic -v"],
)
def test_v_is_taken_after_data_and_its_sub_verbs(argv, tmp_path, capsys):
    """Defect: ``data check -v ...`` and ``data export synthetic -v ...`` were "unrecognized arguments:
    -v", ``--verbose`` after an override "unrecognized arguments: --verbose (did you mean --verbose?)",
    though ``data --help`` lists -v."""
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert err.strip().splitlines()[-1].startswith("error: data.num_")


def test_an_unknown_option_of_data_check_gets_check_s_usage_and_a_suggestion(capsys):
    """Defect: ``data check --confg demo`` printed ``data``'s usage and no suggestion."""
    with pytest.raises(SystemExit) as stop:
        main(["data", "check", "--confg", "demo"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: patchword data check ")
    assert err.strip().endswith(
        "patchword data check: error: unrecognized arguments: --confg (did you mean --config?)"
    )


def test_an_option_is_never_suggested_for_itself():
    """Defect: "unrecognized arguments: --verbose (did you mean --verbose?)"."""
    import argparse

    from patchword.config import _did_you_mean

    parser = argparse.ArgumentParser()
    parser.add_argument("--verbose", action="store_true")
    assert _did_you_mean(parser, ["--verbose"]) == ""
    assert _did_you_mean(parser, ["--verbos"]) == " (did you mean --verbose?)"


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["eval", "RUN", "--split", "dev"], "eval.split=dev"),
        (["train", "--eval-split=dev"], "eval.split=dev"),
        (["train", "--seed", "3"], "seed=3"),
        (["eval", "RUN", "--coco-1k"], "eval.coco_1k=true"),
        (["train", "--max_steps"], "train.max_steps=VALUE"),
        (["hash", "train", "--num-query", "4"], "data.num_query=4"),  # hash's own config (HashRunConfig)
    ],
)
def test_an_option_that_is_a_config_key_is_answered_with_the_override(argv, suggestion, capsys):
    """Defect: ``eval RUN --split dev`` said "(did you mean --suite?)"; the setting is the override
    eval.split=dev."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith(f"(did you mean the override {suggestion}?)"), last


def test_hash_pages_say_what_v_does(capsys):
    """``hash``'s sub-verb pages said "as above" for -v, with nothing above it."""
    with pytest.raises(SystemExit):
        main(["hash", "train", "--help"])
    assert "show debug logging and the traceback of an error" in capsys.readouterr().out


def test_a_verb_without_overrides_suggests_no_override(capsys):
    """``report`` takes no overrides: its unknown ``--split`` is not answered with one."""
    with pytest.raises(SystemExit):
        main(["report", "RUN", "--split", "dev"])
    assert "override" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "-v", "scoring", "--quick", "--configs", "nope"],
        ["bench", "scoring", "-v", "--quick", "--configs", "nope"],
        ["-v", "bench", "scoring", "--quick", "--configs", "nope"],
    ],
    ids=["bench -v scoring", "bench scoring -v", "-v bench"],
)
def test_bench_takes_v_anywhere_and_logs_debug(argv, capsys):
    """Defect: ``bench -v scoring`` was "unrecognized arguments: -v" (the group parser had no -v), and
    ``patchword -v bench ...`` showed tracebacks but no debug lines (setup_logging without verbose)."""
    logging.getLogger().setLevel(logging.INFO)
    assert main(argv) == 2
    assert logging.getLogger().level == logging.DEBUG
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: --configs: ")


def test_serve_v_turns_on_debug_logging(tmp_path, capsys):
    """Defect: ``serve -v`` logged at --log-level (info), though its help says debug logging."""
    from patchword.cli.serve import main_serve

    logging.getLogger().setLevel(logging.INFO)
    assert main_serve([str(tmp_path), "-v", "--port", "70000"]) == 2  # refused before anything loads
    assert logging.getLogger().level == logging.DEBUG
    assert "Traceback" in capsys.readouterr().err


def test_version(capsys):
    """Defect: ``patchword --version`` was "unknown option --version"."""
    from patchword.version import __version__

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"patchword {__version__}\n"
