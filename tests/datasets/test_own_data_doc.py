"""docs/own_data.md's ``data check`` commands run as printed on the tiny copies of its files
(tests/own_data_support.py), and its sample output is what the first one prints."""

from __future__ import annotations

import re
import shlex

import pytest

from own_data_support import write_own_data
from patchword.cli import main
from project_paths import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

DOC = ROOT / "docs" / "own_data.md"


def _commands(verb: str) -> list[str]:
    """The documentation's ``patchword VERB`` commands, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [line for line in lines if line.startswith(f"patchword {verb} ")]


@pytest.fixture(scope="module")
def own_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("own")
    write_own_data(out)
    return out


def _run(command: str, out, capsys) -> list[str]:
    args = shlex.split(command.replace("/data/", f"{out}/data/").replace("/weights/", f"{out}/weights/"))
    capsys.readouterr()
    code = main(args[1:])
    printed = capsys.readouterr().out.replace(f"{out}/data/", "/data/")
    assert code == 0, printed
    return [line.rstrip() for line in printed.splitlines()]


def test_every_documented_data_check_runs(own_data, capsys):
    commands = _commands("data check")
    recipes = {shlex.split(c)[4] for c in commands}
    assert recipes == {"f30k_seps_vit224", "scan_t2i_f30k", "scan_i2t_f30k", "naaf_f30k", "tgdt_f30k"}
    assert len(commands) == 7
    for command in commands:
        lines = _run(command, own_data, capsys)
        assert lines[-1] == "ok" and not any("warning" in line for line in lines), lines


def test_the_documented_output_is_the_first_check(own_data, capsys):
    shown = re.search(r"### What `data check` prints\n.*?```\n(.*?)```", DOC.read_text(), flags=re.S)
    assert _run(_commands("data check")[0], own_data, capsys) == shown.group(1).splitlines()
