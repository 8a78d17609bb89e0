"""``--help`` of ``patchword`` itself, data (check, export synthetic), bench (scoring, two-stage, gallery,
all), serve, search and index (build): every option and positional says what it is, one with a default
shows it, and no page says "as above" (a page is read alone). test_cli_help_texts_b.py: the other verbs."""

from __future__ import annotations

import argparse

import pytest

from patchword.cli import _parser as patchword_parser
from patchword.cli import bench, search, serve


def _pages() -> dict[str, argparse.ArgumentParser]:
    """Every parser of these verbs, by command line (bench's internal ``_rss`` probe left out: it is no
    page, ``bench --help`` does not list it)."""
    top = patchword_parser()
    pages = {"patchword": top}
    todo = [
        ("patchword bench", bench._parser()),
        ("patchword serve", serve._parser()),
        ("patchword search", search._search_parser()),
        ("patchword index", search._index_parser()),
    ]
    for action in top._actions:  # `data` of the verbs the top-level parser builds
        if isinstance(action, argparse._SubParsersAction):
            todo.append(("patchword data", action.choices["data"]))
    while todo:
        name, parser = todo.pop()
        pages[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {sub}", p) for sub, p in action.choices.items() if sub != "_rss"]
    return pages


def _options() -> list[tuple[str, argparse.Action]]:
    return [
        (page, action)
        for page, parser in _pages().items()
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
    ]


def _name(action: argparse.Action) -> str:
    return "/".join(action.option_strings) or action.dest


OPTIONS = _options()


def test_the_pages_are_all_there():
    assert {"patchword data check", "patchword data export synthetic", "patchword bench two-stage"} <= set(
        _pages()
    )
    assert {"patchword bench all", "patchword bench gallery", "patchword index build"} <= set(_pages())


@pytest.mark.parametrize(("page", "action"), OPTIONS, ids=[f"{p} {_name(a)}" for p, a in OPTIONS])
def test_every_option_has_help_and_shows_its_default(page, action):
    """Defect: no help for data export synthetic --split (nor its default, test), serve --log-level, bench
    two-stage/all --backend; no default shown for serve --max-pending, search/serve --shortlist, bench
    --ks, --alpha, --configs, --backend, --max-memory-mb; every verb's -v said "as above" with nothing
    above it on its page."""
    text = action.help
    assert text and text.strip(), f"{page} {_name(action)}: no help"
    assert "as above" not in text, f"{page} {_name(action)}: {text!r}"
    if action.option_strings and action.dest == "shortlist":  # default None: the searcher's, said
        from patchword.search.query import DEFAULT_SHORTLIST

        assert f"else {DEFAULT_SHORTLIST})" in text, text
    default = action.default
    if default in (None, False, argparse.SUPPRESS) or default in ([], ()):
        return
    assert "%(default)" in text or str(default) in text, f"{page} {_name(action)}: default {default!r}"


def test_v_says_what_it_does_on_every_page():
    """The one wording of -v, on the pages of the verbs and their sub-verbs alike."""
    from patchword.cli import VERBOSE_HELP

    for page, action in OPTIONS:
        if "-v" in action.option_strings:
            assert action.help.startswith(VERBOSE_HELP), (page, action.help)
