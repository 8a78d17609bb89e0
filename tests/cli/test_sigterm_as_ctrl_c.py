"""SIGTERM (a scheduler's stop, ``kill``, ``timeout``) stops every command as a Ctrl-C does: one
``interrupted:`` line, exit code 143, what the command holds released. Its default action killed the process
on the spot and silently: ``index build`` left its ``.build.lock``, ``eval --out -`` its temporary folder.
The executable (``console_main``) then ends the process by the signal, as Python does after an uncaught
Ctrl-C: a shell sees 143 (130), Python's ``subprocess`` a return code of -15 (-2).

The subprocess tests are deterministic: the child announces on stdout that it reached the point to stop at
and waits there for the signal (at most the hang guard), whatever the machine's speed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from patchword.cli.search import main_index
from patchword.errors import Terminated
from patchword.search.manifest import LOCK_FILE, Manifest
from project_paths import ROOT
from stall_support import HANG_GUARD_S, signal_when_announced

#: The child: ``module.name`` replaced by a function that says "reached" on stdout and waits for the
#: signal (after running the real one when ``after``); then the command, as the console script runs it.
_STOP_AT = textwrap.dedent(
    """
    import importlib, sys, time

    module = importlib.import_module({module!r})
    real, calls = getattr(module, {name!r}), []

    def reached(*args, **kwargs):
        result = real(*args, **kwargs) if {after} else None
        calls.append(1)
        if len(calls) == 1:
            print("reached", flush=True)
            time.sleep({hang})
        return result

    setattr(module, {name!r}, reached)
    sys.argv = ["patchword", *sys.argv[1:]]
    from patchword.cli.console import console_main

    sys.exit(console_main())
    """
)


def _stopped(argv: list[str], at: str, after: bool, tmp_path: Path, signum: int = signal.SIGTERM):
    """Run ``patchword argv`` in a child stopped at ``at`` (``module:function``), send it ``signum`` there:
    ``(exit code, stderr)``. The child's temporary files go to ``tmp_path / "tmp"``."""
    module, name = at.split(":")
    child = _STOP_AT.format(module=module, name=name, after=after, hang=HANG_GUARD_S)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path / "tmp")}
    return signal_when_announced([sys.executable, "-c", child, *argv], "reached\n", signum, env)


def _build_argv(env, out: Path) -> list[str]:
    images = env.export.files["images"]
    return [
        "index",
        "build",
        str(env.run_dir),
        "--images",
        str(images),
        "--out",
        str(out),
        "--shard-size",
        "8",
    ]


def test_sigterm_during_an_index_build_releases_its_lock_and_the_same_command_resumes(env, tmp_path):
    """Old code: killed silently (exit -15), ``.build.lock`` left in the index folder."""
    out = tmp_path / "idx"
    argv = _build_argv(env, out)
    code, err = _stopped(argv, "patchword.search.index:write_shard", True, tmp_path)
    assert code == -signal.SIGTERM and "Traceback" not in err, (code, err)
    assert err.splitlines()[-1] == f"interrupted: SIGTERM; rerun the same command to resume {out}"
    assert not (out / LOCK_FILE).exists()
    assert main_index(argv[1:]) == 0  # the same command resumes it
    assert Manifest.read(out).state == "complete"


def test_sigterm_during_eval_to_stdout_leaves_no_temporary_folder(env, tmp_path):
    """``eval --out -`` writes its record in a temporary folder, printed and removed. Old code: killed
    silently (exit -15), the empty ``patchword-eval-*`` folder left in the system's temporary directory."""
    argv = ["eval", str(env.run_dir), "--out", "-"]
    code, err = _stopped(argv, "patchword.runs.evaluate:evaluate_run_dir", False, tmp_path)
    assert code == -signal.SIGTERM and "Traceback" not in err, (code, err)
    assert err.splitlines()[-1] == "interrupted: SIGTERM"
    assert os.listdir(tmp_path / "tmp") == []


def _failing_command(child: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run ``child`` (a script ending in ``console_main()``) on a command that imports torch and fails at
    once (exit code 2: ``--images`` names no folder), in ``tmp_path``."""
    argv = ["index", "build", str(tmp_path / "run"), "--images", str(tmp_path / "no-such"), "--out", "o"]
    return subprocess.run(
        [sys.executable, "-c", child, *argv],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        cwd=tmp_path,
    )


#: The child of the shutdown tests: a command that fails (exit code 2) at once, and a signal to itself
#: ``when``: in an exit handler, or in module teardown (after the exit handlers: an object of ``__main__``
#: that ``__del__`` sends it, as Python clears the module).
_LATE_SIGNAL = textwrap.dedent(
    """
    import atexit, os, sys

    class SignalsWhenCleared:
        def __del__(self):
            os.kill(os.getpid(), {signum})

    if {when!r} == "exit handler":
        atexit.register(lambda: os.kill(os.getpid(), {signum}))
    else:
        keep = SignalsWhenCleared()
    sys.argv = ["patchword", *sys.argv[1:]]
    from patchword.cli.console import console_main

    sys.exit(console_main())
    """
)


@pytest.mark.parametrize("when", ["exit handler", "module teardown"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_the_interpreter_exits_keeps_the_command_s_exit_code(signum, when, tmp_path):
    """Everything is written once ``main()`` returned; the interpreter's shutdown takes most of a second
    more (torch's teardown). Old code: a signal then killed the process (exit -15 / 130) with no message, as
    if the command had failed, once with a KeyboardInterrupt traceback from an exit handler."""
    child = _LATE_SIGNAL.format(signum=int(signum), when=when)
    proc = _failing_command(child, tmp_path)
    assert proc.returncode == 2, proc
    assert proc.stderr.splitlines() == [f"error: --images: image folder not found: {tmp_path / 'no-such'}"]


def test_the_console_script_and_python_m_run_console_main():
    """Both ways of starting patchword get :func:`~patchword.cli.console.console_main`'s handling at exit."""
    # (tomllib is Python 3.11+; the project supports 3.10): the console script's line, not package-data's
    lines = (ROOT / "pyproject.toml").read_text(encoding="utf-8").splitlines()
    assert [line for line in lines if line.startswith('patchword = "')] == [
        'patchword = "patchword.cli.console:console_main"'
    ]
    main_module = (ROOT / "src/patchword/__main__.py").read_text()
    assert "from patchword.cli.console import console_main" in main_module
    assert "raise SystemExit(console_main())" in main_module


def test_a_stop_after_the_index_was_complete_says_nothing_is_left(env, tmp_path, monkeypatch, capsys):
    """A SIGTERM after the last manifest was written (while the report was printed): old code said "rerun
    the same command to resume", and that command was refused ("already holds a complete index")."""
    import patchword.cli.search as cli_search

    real = cli_search._build_and_upload

    def then_stopped(*args, **kwargs):
        real(*args, **kwargs)
        raise Terminated

    out = tmp_path / "idx"
    monkeypatch.setattr(cli_search, "_build_and_upload", then_stopped)
    assert main_index(_build_argv(env, out)[1:]) == 143
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"interrupted: SIGTERM after {out} was complete: nothing is left to do"
    assert Manifest.read(out).state == "complete"


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, 0)], ids=["SIGTERM", "SIGINT"]
)
def test_a_server_stops_on_a_signal_with_its_documented_exit_code(env, signum, code):
    """docs/search.md "Stopping": Ctrl-C exits 0; SIGTERM ends the process by SIGTERM (a shell's 143, a
    clean stop to systemd, for which an exit code of 143 is a failure), each after a graceful shutdown and
    without an ``interrupted:`` line. uvicorn raises the signal again once it has shut down: SIGTERM now
    meets patchword's handler (errors.Terminated, a KeyboardInterrupt), where its default action ended the
    process; caught as a Ctrl-C, the server exited 0."""
    import time
    import urllib.request

    argv = [sys.executable, "-m", "patchword", "serve", str(env.index_dir), "--port", "0", "--workers", "1"]

    def answering(line: str) -> bool:  # "serving N images of INDEX at http://127.0.0.1:PORT/ (...)"
        if not line.startswith("serving "):
            return False
        url = line.split(" at ", 1)[1].split(" ", 1)[0]
        deadline = time.monotonic() + HANG_GUARD_S
        while True:  # uvicorn's own signal handlers are installed once it answers
            try:
                with urllib.request.urlopen(url + "healthz", timeout=5) as answer:
                    return answer.status == 200
            except OSError:
                assert time.monotonic() < deadline, "the server never answered"
                time.sleep(0.1)

    returned, err = signal_when_announced(argv, answering, signum, {**os.environ, "OMP_NUM_THREADS": "1"})
    assert returned == code, (returned, err)
    assert "interrupted:" not in err and "Traceback" not in err, err


#: The child of the torch-import test: a signal to itself while torch's C++ start-up imports numpy (a
#: finder that sees ``numpy.matrixlib`` imported while ``torch`` is, says so on stdout and signals).
_SIGNAL_INSIDE_TORCH = textwrap.dedent(
    """
    import importlib.abc, os, sys

    class SignalInsideTorchImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "numpy.matrixlib" and "torch" in sys.modules:
                sys.meta_path.remove(self)
                print("signalled inside torch's import", flush=True)
                os.kill(os.getpid(), {signum})
            return None

    sys.meta_path.insert(0, SignalInsideTorchImport())
    sys.argv = ["patchword", *sys.argv[1:]]
    from patchword.cli.console import console_main

    sys.exit(console_main())
    """
)


@pytest.mark.parametrize(
    ("signum", "said"),
    [(signal.SIGINT, "SIGINT (Ctrl-C)"), (signal.SIGTERM, "SIGTERM")],
    ids=["SIGINT", "SIGTERM"],
)
def test_a_signal_inside_torch_s_import_stops_the_command_once_torch_is_imported(signum, said, tmp_path):
    """torch's C++ start-up imports numpy and swallows the KeyboardInterrupt a signal raises there. Old
    code: the command went on with numpy half imported and failed later with a traceback (``module 'numpy'
    has no attribute 'matrix'``) or ran to its end as if no signal had come (here: exit code 2, the
    missing folder's error), once a C++ ``terminate`` (exit -6). Now the signal waits for the import
    (``cli._import_torch``)."""
    child = _SIGNAL_INSIDE_TORCH.format(signum=int(signum))
    proc = _failing_command(child, tmp_path)
    assert proc.stdout == "signalled inside torch's import\n", proc  # numpy was first imported by torch
    assert "Traceback" not in proc.stderr, proc.stderr
    said = f"interrupted: {said} before the command started: nothing was done"
    assert (proc.returncode, proc.stderr.splitlines()) == (-signum, [said])


def test_a_signal_while_a_removable_lock_is_taken_leaves_no_lock_file(tmp_path, monkeypatch):
    """``index build``'s ``.build.lock`` (and ``pretrain --out``'s): a signal landing after the file was
    created and before the block that removes it began (here: while the file is locked) raises once the
    lock is held and its removal registered. Old code: the file stayed beside the index (helper-213's
    fuzzing; the rerun worked, the folder was littered)."""
    from patchword import locks
    from patchword.errors import sigterm_interrupts

    real = locks._lock_or_refuse

    def signalled_while_locking(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(locks, "_lock_or_refuse", signalled_while_locking)
    path = tmp_path / ".build.lock"
    ran = []
    with pytest.raises(Terminated), sigterm_interrupts(), locks.removable_lock(path, "busy"):
        ran.append(True)
    assert not path.exists() and ran == []


def test_held_signals_raise_after_the_block_or_at_once_when_a_second_comes():
    """``stop_signals_held``: the first signal waits for the block's end (torch's import, a lock being taken);
    a second one stops at once (a slow import must not make a user's Ctrl-C useless); the handlers before
    it are back either way."""
    from patchword.errors import sigterm_interrupts, stop_signals_held

    with sigterm_interrupts():
        before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
        ran = []
        with pytest.raises(Terminated), stop_signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            ran.append("after the first")
        assert ran == ["after the first"]
        with pytest.raises(KeyboardInterrupt) as second, stop_signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
        # the second one (SIGINT), raised as it came: the end of the block raises the first only
        assert not isinstance(second.value, Terminated)
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
