"""``--help`` of eval, report, export, hash (train, eval, search) and densify (run, merge, stats): every
option and positional says what it is, and one with a default shows it; hash train's shortcut flags
(default None: the config decides) show the config's default of the key they set."""

from __future__ import annotations

import argparse

import pytest

from patchword.cli import densify, evaluate, export, report
from patchword.cli import hash as hash_cli


def _verb(module) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"patchword {module.__name__.rsplit('.', 1)[-1]}")
    module.add_arguments(parser)
    return parser


def _pages() -> dict[str, argparse.ArgumentParser]:
    """Every parser of these verbs, by command line."""
    pages = {
        "patchword eval": _verb(evaluate),
        "patchword report": _verb(report),
        "patchword export": _verb(export),
        "patchword densify": densify._run_parser(),
        "patchword densify merge": densify._merge_parser(),
        "patchword densify stats": densify._stats_parser(),
    }
    todo = [("patchword hash", hash_cli._parser())]
    while todo:  # hash's sub-commands
        name, parser = todo.pop()
        pages[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {sub}", p) for sub, p in action.choices.items()]
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


def _shown(default) -> str:
    """A default as the help text writes it (``[90, 128]``: ``90 128``)."""
    if isinstance(default, list | tuple):
        return " ".join(map(str, default))
    return str(default)


OPTIONS = _options()


@pytest.mark.parametrize(("page", "action"), OPTIONS, ids=[f"{p} {_name(a)}" for p, a in OPTIONS])
def test_every_option_has_help_and_shows_its_default(page, action):
    """Defect: no help at all for hash train --epochs/--loss/--seed/--batch-size/--output-dir, hash eval
    and hash search RUN_DIR, hash search --backend, densify --precision/--max-new-tokens, densify merge
    --out, densify stats FILE...; no default shown for densify --batch-size (8) or stats --token-limits."""
    assert action.help and action.help.strip(), f"{page} {_name(action)}: no help"
    default = action.default
    if default in (None, False, argparse.SUPPRESS) or default in ([], ()):
        return
    text = action.help
    assert "%(default)" in text or _shown(default) in text, f"{page} {_name(action)}: default {default!r}"


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
    (train,) = [p for name, p in _pages().items() if name == "patchword hash train"]
    (action,) = [a for a in train._actions if a.dest == attr]
    default = _config_default(key)
    if default == "":  # no value (a file not given; the run name made from the settings)
        return
    assert f"default {default}" in action.help, f"--{attr}: {action.help!r} lacks the default {default!r}"


def test_the_walk_covers_every_page():
    assert {"patchword hash train", "patchword hash eval", "patchword hash search"} <= set(_pages())
    assert len(_pages()) == 10 and len(OPTIONS) > 60
