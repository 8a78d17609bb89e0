"""A Ctrl-C in the first second or two of a command, while its modules (torch among them) are still being
imported, before the verb's own handling of interrupts starts: one ``interrupted:`` line and exit code 130,
as later, never Python's traceback (a CLI review: `patchword train ...` then Ctrl-C printed one).

The subprocess tests are deterministic: the child's ``import torch`` announces itself on stdout and waits
there, so the SIGINT arrives inside that import whatever the machine's speed (a child that never imports
torch fails the test rather than passing it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from patchword.cli import main
from stall_support import HANG_GUARD_S

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
    else:  # what the console script `patchword = "patchword.cli:main"` does
        from patchword.cli import main

        sys.exit(main())
    """
)


@pytest.mark.parametrize("as_module", [True, False], ids=["python -m patchword", "console script"])
def test_ctrl_c_while_torch_is_imported_exits_130_without_a_traceback(as_module, tmp_path):
    child = _CHILD.format(hang=HANG_GUARD_S, as_module=as_module)
    argv = ["train", "train.max_steps=1", f"output_dir={tmp_path}"]
    proc = subprocess.Popen(
        [sys.executable, "-c", child, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        announced = proc.stdout.readline()  # blocks until the child is inside `import torch`
        assert announced == "importing torch\n", (announced, proc.communicate(timeout=HANG_GUARD_S))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err, err
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip().splitlines()[-1].startswith("interrupted: SIGINT (Ctrl-C)"), err
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
