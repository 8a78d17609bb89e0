"""What ``--help`` prints is for people at a terminal: no reST markup from the docstrings it is built from."""

from __future__ import annotations

import re

import pytest

from patchword.cli import VERBS, main

# every help page: the command, each verb, and each sub-verb of a verb that has them
PAGES = [[], *([verb] for verb in VERBS)] + [
    ["hash", "train"],
    ["hash", "eval"],
    ["hash", "search"],
    ["bench", "scoring"],
    ["bench", "two-stage"],
    ["bench", "gallery"],
    ["densify", "merge"],
    ["densify", "stats"],
    ["data", "check"],
    ["data", "export"],
    ["data", "export", "synthetic"],
    ["index", "build"],
]
MARKUP = re.compile(r"``|:(?:class|func|meth|mod|data|attr):`")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: " ".join(page) or "patchword")
def test_help_pages_show_no_docstring_markup(page, capsys):
    """Defect: ``patchword --help`` and ``patchword hash --help`` printed their module docstrings' first
    lines, reST double backquotes included (````patchword hash train|eval|search````)."""
    with pytest.raises(SystemExit) as stop:
        main([*page, "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: patchword")
    assert not MARKUP.search(text), MARKUP.search(text).group(0)
