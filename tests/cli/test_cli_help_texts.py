"""``--help`` of every verb and sub-verb: every option and positional says what it is, one with a default
shows it, and no page says "as above" (a page is read alone); hash train's shortcut flags (default None:
the config decides) show the config's default of the key they set.

The pages: ``patchword`` itself and the verbs its parser builds (data, eval, report, export, ...), then the
verbs that parse their own arguments (bench, serve, search, index, hash, densify) with their sub-verbs."""

from __future__ import annotations

import argparse

import pytest

from patchword.cli import _parser as patchword_parser
from patchword.cli import bench, densify, search, serve
from patchword.cli import hash as hash_cli


def _pages() -> dict[str, argparse.ArgumentParser]:
    """Every parser, by command line (bench's internal ``_rss`` probe left out: it is no page, ``bench
    --help`` does not list it; a verb that parses its own arguments is a placeholder in the top parser)."""
    pages: dict[str, argparse.ArgumentParser] = {}
    todo = [
        ("patchword", patchword_parser()),
        ("patchword bench", bench._parser()),
        ("patchword serve", serve._parser()),
        ("patchword search", search._search_parser()),
        ("patchword index", search._index_parser()),
        ("patchword hash", hash_cli._parser()),
        ("patchword densify", densify._run_parser()),
        ("patchword densify merge", densify._merge_parser()),
        ("patchword densify stats", densify._stats_parser()),
    ]
    while todo:
        name, parser = todo.pop()
        if name in pages:  # the delegated verbs' placeholders in the top parser
            continue
        pages[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {sub}", p) for sub, p in action.choices.items() if sub != "_rss"]
    return pages


def _name(action: argparse.Action) -> str:
    return "/".join(action.option_strings) or action.dest


def _shown(default) -> str:
    """A default as the help text writes it (``[90, 128]``: ``90 128``)."""
    if isinstance(default, list | tuple):
        return " ".join(map(str, default))
    return str(default)


PAGES = _pages()
OPTIONS = [
    (page, action)
    for page, parser in PAGES.items()
    for action in parser._actions
    if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
    and action.help != "==SUPPRESS=="
]


@pytest.mark.parametrize(("page", "action"), OPTIONS, ids=[f"{p} {_name(a)}" for p, a in OPTIONS])
def test_every_option_has_help_and_shows_its_default(page, action):
    """Defect: no help for data export synthetic --split (nor its default, test), serve --log-level, bench
    two-stage/all --backend, hash train --epochs/--loss/--seed/--batch-size/--output-dir, hash eval and
    hash search RUN_DIR, densify --precision/--max-new-tokens, densify merge --out, densify stats FILE...;
    no default shown for serve --max-pending, search/serve --shortlist, bench --ks, --alpha, --configs,
    --backend, --max-memory-mb, densify --batch-size or stats --token-limits; every verb's -v said "as
    above" with nothing above it on its page."""
    text = action.help
    assert text and text.strip(), f"{page} {_name(action)}: no help"
    assert "as above" not in text, f"{page} {_name(action)}: {text!r}"
    if action.option_strings and action.dest == "shortlist":  # default None: the searcher's, said
        from patchword.search.query import DEFAULT_SHORTLIST

        assert f"else {DEFAULT_SHORTLIST})" in text, text
    default = action.default
    if default in (None, False, argparse.SUPPRESS) or default in ([], ()):
        return
    assert "%(default)" in text or _shown(default) in text, f"{page} {_name(action)}: default {default!r}"


def test_v_says_what_it_does_on_every_page():
    """The one wording of -v, on the pages of the verbs and their sub-verbs alike."""
    from patchword.cli import VERBOSE_HELP

    for page, action in OPTIONS:
        if "-v" in action.option_strings:
            assert action.help.startswith(VERBOSE_HELP), (page, action.help)


def _config_default(key: str):
    from patchword.hashing.config import HashRunConfig

    value = HashRunConfig()
    for part in key.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize(("attr", "key"), sorted(hash_cli._SHORTCUTS.items()))
def test_hash_train_shortcut_flags_show_the_config_default(attr, key):
    """Defect: ``hash train --bits`` (64) and ``--data`` (synthetic) said nothing of their defaults (the
    flags' own default is None: not given, the config's value holds)."""
    (action,) = [a for a in PAGES["patchword hash train"]._actions if a.dest == attr]
    default = _config_default(key)
    if default == "":  # no value (a file not given; the run name made from the settings)
        return
    assert f"default {default}" in action.help, f"--{attr}: {action.help!r} lacks the default {default!r}"


def test_the_walk_covers_every_page():
    wanted = {"data check", "data export synthetic", "eval", "report", "export", "bench two-stage"}
    wanted |= {"bench all", "bench gallery", "index build", "hash train", "hash eval", "hash search"}
    wanted |= {"densify merge", "densify stats", "serve", "search", "sweep", "train"}
    assert {f"patchword {page}" for page in wanted} <= set(PAGES)
