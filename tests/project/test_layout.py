"""The package's structure: the import contracts of pyproject.toml hold (and catch a planted violation), no
cycle among the modules' top-level imports, one version."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from project_paths import ROOT

SRC = ROOT / "src" / "patchword"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(package_parent: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        capture_output=True,
        text=True,
        env=env,
        cwd=package_parent,
        timeout=600,  # a hang guard only
    )


def test_the_import_contracts_hold_and_a_planted_violation_breaks_them(tmp_path):
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy / "patchword", ignore=shutil.ignore_patterns("__pycache__"))
    done = _lint_imports(copy)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout
    # a matcher module reaching into the training application, inside a function as cycles used to hide
    registry = copy / "patchword" / "matching" / "registry.py"
    registry.write_text(
        registry.read_text() + "\n\ndef _planted():\n    from patchword.train import runner\n"
    )
    done = _lint_imports(copy)
    assert done.returncode != 0
    assert "patchword.matching.registry -> patchword.train" in done.stdout


def _top_level_imports(path: Path, module: str) -> set[str]:
    """The patchword modules ``module`` imports when it is imported (its top-level statements)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("patchword")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            if base.startswith("patchword"):
                found |= {f"{base}.{a.name}" for a in node.names} | {base}
    return found


def _module_graph() -> dict[str, set[str]]:
    files = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for module, path in files.items():
        targets = set()
        for name in _top_level_imports(path, module):
            while name and name not in files:  # an imported name: its module
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def test_no_cycle_among_the_top_level_imports():
    graph = _module_graph()
    assert len(graph) > 150  # the walk found the package
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [target]
                if not (module.startswith(target + ".") or target == "patchword"):
                    pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_one_version():
    import re

    from patchword import __version__

    # (tomllib is Python 3.11+; the project supports 3.10): the [project] table's version line
    text = (ROOT / "pyproject.toml").read_text()
    project = text[text.index("[project]") :]
    assert re.search(r'^version = "([^"]+)"$', project, re.M).group(1) == __version__


# Where a matcher's name may be spelled: its own package, the per-matcher importers, engines and references,
# the recipes, and the SEPS scoring benchmark's configurations. ``laps`` is also a dataset layout (the
# official LAPS/SEPS file layout), which the data readers name.
NAME_HOMES = (
    "matching/",
    "imports/",
    "testing/",
    "configs/",
    "model_configs/",
    "eval/engine/",
    "bench/inputs.py",
)
DATASET_HOMES = ("data/", "densify/sources.py")


def test_no_matcher_name_outside_the_matchers():
    """f715cbc: model.py asked ``cfg.matcher == "tgdt"``, export.py ``in ("seps", "laps")``, pretrain.py
    ``in ("clip", "vse")``; the matchers now declare those traits (``Matcher.reads_stage1_tokens``,
    ``token_level``, ``register_matcher(report=...)``)."""
    from patchword.matching import list_matchers

    names = set(list_matchers())
    found = []
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        if where.startswith(NAME_HOMES):
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings:
                if node.value == "laps" and where.startswith(DATASET_HOMES):
                    continue
                found.append(f"{where}:{node.lineno}: {node.value!r}")
    assert found == []


def test_every_module_over_400_lines_says_why():
    """CONTRIBUTING.md: no file over ~400 lines without a reason, given at the top of its docstring."""
    unexplained = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 400 and "Over 400 lines: " not in (
            ast.get_docstring(ast.parse(text)) or ""
        ):
            unexplained.append(path.relative_to(SRC).as_posix())
    assert unexplained == []


def test_a_function_level_import_that_dodges_a_cycle_says_so():
    """An import inside a function that would close an import cycle at the top of its module (through
    the modules' top-level imports and their packages' ``__init__``) carries a comment saying why it stays
    there; f715cbc hid factory -> runs -> factory and model -> factory this way."""
    graph = _module_graph()

    def parents(module: str) -> list[str]:  # a module's packages, below the root (which imports the factory)
        parts = module.split(".")
        return [".".join(parts[:i]) for i in range(2, len(parts)) if ".".join(parts[:i]) in graph]

    def reaches(start: str, goal: str) -> bool:
        seen, stack = {start}, [start]
        while stack:
            current = stack.pop()
            for nxt in [*graph[current], *parents(current)]:
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return False

    silent = []
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        lines = path.read_text().splitlines()
        for function in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("patchword"):
                    continue
                target = node.module
                while target and target not in graph:
                    target = target.rpartition(".")[0]
                if target and target != module and reaches(target, module):
                    said = "#" in lines[node.lineno - 1] or lines[node.lineno - 2].strip().startswith("#")
                    if not said:
                        silent.append(f"{module}:{node.lineno} imports {node.module}")
    assert silent == []
