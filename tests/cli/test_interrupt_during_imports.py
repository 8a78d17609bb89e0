"""A Ctrl-C (or SIGTERM) in the first second or two of a command, while its modules (torch among them) are
still being imported, before the verb's own handling of interrupts starts: one ``interrupted:`` line and exit
code 130 (143), as later, never Python's traceback (a CLI review: `patchword train ...` then Ctrl-C printed
one).

The subprocess tests are deterministic: the child's ``import torch`` announces itself on stdout and waits
there, so the SIGINT arrives inside that import whatever the machine's speed (a child that never imports
torch fails the test rather than passing it)."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import textwrap

import pytest

from patchword.cli import main
from stall_support import HANG_GUARD_S, signal_when_announced

#: The child: a finder that stops ``import torch`` (wherever the command imports it first) to say so on
#: stdout and wait for the signal; then the command, as ``python -m patchword`` or the console script runs it.
_CHILD = textwrap.dedent(
    """
    import importlib.abc, sys, time

    class StopAtTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch":
                sys.meta_path.remove(self)
                print("importing torch", flush=True)
                time.sleep({hang})  # SIGINT arrives here, inside `import torch`
            return None

    sys.meta_path.insert(0, StopAtTorch())
    sys.argv = ["patchword", *sys.argv[1:]]
    if {as_module}:
        import runpy

        runpy.run_module("patchword", run_name="__main__", alter_sys=True)
    else:  # what the console script `patchword = "patchword.cli.console:console_main"` does
        from patchword.cli.console import console_main

        sys.exit(console_main())
    """
)


@pytest.mark.parametrize(
    ("signum", "said"),
    [(signal.SIGINT, "SIGINT (Ctrl-C)"), (signal.SIGTERM, "SIGTERM")],
    ids=["SIGINT", "SIGTERM"],
)
@pytest.mark.parametrize("as_module", [True, False], ids=["python -m patchword", "console script"])
def test_a_stop_while_torch_is_imported_is_one_line_without_a_traceback(as_module, signum, said, tmp_path):
    """SIGTERM as a Ctrl-C; old code: killed silently. The process ends by the signal (console_main): a
    shell's exit code 130 / 143."""
    child = _CHILD.format(hang=HANG_GUARD_S, as_module=as_module)
    argv = ["train", "train.max_steps=1", f"output_dir={tmp_path}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    code, err = signal_when_announced([sys.executable, "-c", child, *argv], "importing torch\n", signum, env)
    assert "Traceback" not in err, err
    assert code == -signum, (code, err)
    assert err.strip().splitlines()[-1] == f"interrupted: {said} before the command started: nothing was done"
    assert os.listdir(tmp_path) == []  # nothing was started


def test_ctrl_c_while_main_builds_its_parsers_is_one_line_and_130(monkeypatch, capsys):
    """In-process: the interrupt arrives while main() imports every verb's module to build its parser,
    before the verb's own handler runs. Old code: the KeyboardInterrupt left main()."""
    import patchword.cli as cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_parser", interrupted)
    try:
        code = main(["train", "train.max_steps=1"])
    except KeyboardInterrupt:
        pytest.fail("the interrupt left main(): Python prints its traceback")
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err
    assert err.splitlines() == ["interrupted: SIGINT (Ctrl-C) before the command started: nothing was done"]


def test_a_second_signal_while_the_command_reports_adds_no_false_line(monkeypatch, capsys):
    """A signal landing while the verb's own handling prints its report (a second one: torchrun forwards a
    Ctrl-C as SIGINT, then SIGTERM) leaves that handling: old code then added "before the command started:
    nothing was done" after a command that had run."""
    import patchword.cli as cli

    def reporting_then_interrupted(run, verbose):  # report_errors, its report cut short by a second signal
        try:
            run()
        except KeyboardInterrupt:
            print("interrupted: SIGINT (Ctrl-C)", file=sys.stderr)
            raise KeyboardInterrupt from None
        raise AssertionError("the first signal never came")

    def stopped(args):  # the verb, stopped by the first signal
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "report_errors", reporting_then_interrupted)
    monkeypatch.setattr(importlib.import_module("patchword.cli.report"), "run", stopped)
    code = main(["report", "no-such-run"])
    assert code == 130
    assert capsys.readouterr().err.splitlines() == ["interrupted: SIGINT (Ctrl-C)"]
