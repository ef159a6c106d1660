"""The import graph keeps the layers of docs/architecture.md.

Every module under ``src/torchbucket`` is parsed with :mod:`ast` (nothing is
imported); each ``import``/``from ... import`` that names torchbucket, at module
level, inside a function or under ``TYPE_CHECKING``, is resolved to the module
it loads. Two rules:

* a module imports only its own layer or a layer below it (the emulator is a
  separate tool: it may import only the core, so that it shares no code, and so
  no bug, with the client it is there to test);
* a private module ``torchbucket.x._y`` is imported only from inside package
  ``x`` (root-level private modules such as ``torchbucket._uri`` belong to the
  core and are shared by the whole library). A package's ``__init__`` is its
  user API; a module without ``_`` (``storage/crc32c.py``,
  ``datasets/catalog.py``, ``compose/registry.py``) is what other packages of
  the library may use of it.

The demo is a user of the library: it imports no private module but its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

# The layers, bottom first. A module belongs to the first layer with a prefix
# equal to its name or a dotted parent of it (``listing`` covers the package
# ``torchbucket.listing`` and every module in it).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # errors, plain configs, URIs, argument checks: import nothing above.
    ("core", ("_version", "errors", "config", "_uri", "_checks", "_madvise", "_opclass", "_human")),
    # the event loop thread, retries and deadlines, request accounting and
    # its list-price cost (prices): what every store's request goes through.
    ("runtime", ("runtime",)),
    # the ObjectStore seam and its backends (memory, local, gcs).
    ("storage", ("storage",)),
    # operations over many objects: parallel listing (and its cache), and
    # composing small objects.
    ("operations", ("listing", "compose")),
    # what users construct: datasets, checkpoints, shards.
    ("features", ("datasets", "checkpoint", "shards")),
    # the cost of each read strategy, counted by the features' own plans.
    ("planning", ("cost",)),
    # framework integrations and the dataflux-compatible API.
    ("integrations", ("lightning", "dcp", "dataflux")),
    # a user of the library: public names only (see the private-module rule).
    ("apps", ("demo",)),
    # command-line entry points.
    ("entry", ("cli", "__main__")),
    # the package's facade: curated re-exports, and runtime.accounting's API
    # under its documented name; nothing inside imports them.
    ("facade", ("", "accounting")),
]

# The emulator is beside the stack, not in it: it may import only these.
EMULATOR_MAY_IMPORT = {"core"}

# Cross-package private imports that cannot be avoided, each with its reason.
PRIVATE_ALLOWLIST: set[tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SRC / "torchbucket").rglob("*.py"))}


MODULES = _modules()


def _layer(module: str) -> str:
    rest = module.split(".")[1:]
    if rest and rest[0] == "emulator":
        return "emulator"
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            if prefix == "" and not rest:
                return name
            if prefix and rest and rest[0] == prefix:
                return name
    raise AssertionError(f"{module} is in no layer: add it to LAYERS (and docs/architecture.md)")


RANK = {name: i for i, (name, _) in enumerate(LAYERS)}


def _resolve(importer: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The torchbucket modules an import statement loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "torchbucket"]
    if node.level:
        base = importer.split(".")
        if MODULES[importer].name != "__init__.py":
            base.pop()
        base = base[: len(base) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    if module.split(".")[0] != "torchbucket":
        return []
    found = []
    for alias in node.names:
        sub = f"{module}.{alias.name}"
        found.append(sub if sub in MODULES else module)
    return found


def _edges() -> list[tuple[str, str, int]]:
    edges = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _resolve(module, node):
                    edges.append((module, target, node.lineno))
    return edges


EDGES = _edges()


def test_every_import_resolves_and_every_module_has_a_layer() -> None:
    assert len(MODULES) > 50  # the walk found the package
    unknown = [f"{a}:{line} -> {b}" for a, b, line in EDGES if b not in MODULES]
    assert unknown == []
    for module in MODULES:
        _layer(module)


def test_no_module_imports_a_layer_above_it() -> None:
    wrong = []
    for importer, target, line in EDGES:
        if importer.split(".")[0:2] == target.split(".")[0:2] and target != "torchbucket":
            continue  # inside one top-level package or module
        low, high = _layer(target), _layer(importer)
        if high == "emulator":
            ok = low in EMULATOR_MAY_IMPORT or low == "emulator"
        elif low == "emulator":
            ok = RANK[high] >= RANK["apps"]
        else:
            ok = RANK[low] <= RANK[high] and low != "facade"
        if not ok:
            wrong.append(f"{importer}:{line} ({high}) imports {target} ({low})")
    assert wrong == []


def _private_owner(target: str) -> str | None:
    parts = target.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def test_no_module_imports_another_packages_private_module() -> None:
    wrong = []
    for importer, target, line in EDGES:
        owner = _private_owner(target)
        if owner is None or importer == owner or importer.startswith(owner + "."):
            continue
        if (importer, target) not in PRIVATE_ALLOWLIST:
            wrong.append(f"{importer}:{line} imports {target}")
    assert wrong == []


def test_the_demo_uses_public_names_only() -> None:
    wrong = [
        f"{importer}:{line} imports {target}"
        for importer, target, line in EDGES
        if _layer(importer) == "apps"
        and _private_owner(target) is not None
        and not target.startswith("torchbucket.demo.")
    ]
    assert wrong == []


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("torchbucket.errors", "core"),
        ("torchbucket.runtime.watchdog", "runtime"),
        ("torchbucket.storage.gcs", "storage"),
        ("torchbucket.listing", "operations"),
        ("torchbucket.listing._lister", "operations"),
        ("torchbucket.demo", "apps"),
        ("torchbucket.emulator", "emulator"),
        ("torchbucket", "facade"),
        ("torchbucket.accounting", "facade"),
        ("torchbucket.cost", "planning"),
        ("torchbucket.cost._plan", "planning"),
    ],
)
def test_layer_table_places_known_modules(module: str, layer: str) -> None:
    assert _layer(module) == layer
