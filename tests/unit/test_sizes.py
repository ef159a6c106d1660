"""Modules and functions stay short enough to read (issue 40).

Every module under ``src/torchbucket`` is parsed with :mod:`ast` (nothing is
imported). Two limits, the source of truth for sizes (docs/architecture.md
quotes no line counts):

* a module holds at most ``MODULE_LINES`` lines;
* a function or method (nested ones included), from its ``def`` to its last
  line, docstring included, spans at most ``FUNCTION_LINES`` lines.

ruff's ``C901``/``PLR09xx`` (pyproject.toml) bound a function's branches,
statements and arguments; these bound its length, and a module's. A piece
over a limit is split where it has seams (a step of a loop, a helper class,
a sibling module), not allowlisted: the allowlists are empty and should stay
so; an entry needs a comment saying why the piece cannot be split.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "torchbucket"

MODULE_LINES = 450
FUNCTION_LINES = 80

# Paths relative to src/torchbucket -> why they may be longer.
MODULE_ALLOWLIST: dict[str, str] = {}
# "path:qualified name" -> why it may be longer.
FUNCTION_ALLOWLIST: dict[str, str] = {}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function in ``tree`` with its dotted name (``Class.method``, ``outer.inner``)."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((prefix + child.name, child))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def test_the_package_is_found() -> None:
    assert len(_modules()) > 100


def test_no_module_is_over_the_limit() -> None:
    over = []
    for path in _modules():
        rel = path.relative_to(PACKAGE).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MODULE_LINES and rel not in MODULE_ALLOWLIST:
            over.append(f"{rel}: {lines} lines")
    assert not over, f"modules over {MODULE_LINES} lines (split them): {over}"


def test_no_function_is_over_the_limit() -> None:
    over = []
    for path in _modules():
        rel = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, node in _functions(tree):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > FUNCTION_LINES and f"{rel}:{name}" not in FUNCTION_ALLOWLIST:
                over.append(f"{rel}:{node.lineno} {name}: {lines} lines")
    assert not over, f"functions over {FUNCTION_LINES} lines (split them): {over}"


def test_allowlists_name_what_exists() -> None:
    """An entry outlives its reason when the piece shrinks, moves or goes."""
    stale = []
    for rel in MODULE_ALLOWLIST:
        path = PACKAGE / rel
        if not path.exists() or len(path.read_text(encoding="utf-8").splitlines()) <= MODULE_LINES:
            stale.append(rel)
    for key in FUNCTION_ALLOWLIST:
        rel, _, name = key.partition(":")
        path = PACKAGE / rel
        nodes = _functions(ast.parse(path.read_text(encoding="utf-8"))) if path.exists() else []
        spans = [n.end_lineno - n.lineno + 1 for q, n in nodes if q == name and n.end_lineno]
        if not spans or max(spans) <= FUNCTION_LINES:
            stale.append(key)
    assert not stale, f"allowlist entries no longer needed: {stale}"
