from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import torchbucket


def test_all_is_sorted_and_every_name_resolves() -> None:
    names = [n for n in torchbucket.__all__ if n != "__version__"]
    assert names == sorted(names)
    for name in torchbucket.__all__:
        assert getattr(torchbucket, name) is not None, name


def test_all_matches_the_public_names() -> None:
    public = {n for n in dir(torchbucket) if not n.startswith("_")}
    # Submodules are reachable as attributes once imported; they are not API names.
    modules = {n for n in public if type(getattr(torchbucket, n)).__name__ == "module"}
    assert public - modules == set(torchbucket.__all__) - {"__version__"}


#: The packages whose exported classes and functions users call. ``storage``,
#: ``compose`` and ``runtime`` also export the seams the others are built on
#: (store protocols, the compose path): the reference shows their entry points.
USER_PACKAGES = [
    "torchbucket",
    "torchbucket.accounting",
    "torchbucket.checkpoint",
    "torchbucket.config",
    "torchbucket.dataflux",
    "torchbucket.datasets",
    "torchbucket.dcp",
    "torchbucket.emulator",
    "torchbucket.errors",
    "torchbucket.lightning",
    "torchbucket.listing",
    "torchbucket.shards",
]


@pytest.mark.parametrize("package", USER_PACKAGES)
def test_every_exported_class_and_function_is_in_the_api_reference(package: str) -> None:
    # BudgetConfig, CheckpointReader, apack and others were exported and on no page.
    pages = Path(__file__).resolve().parents[2] / "docs" / "reference"
    targets = re.findall(
        r"^::: *([\w.]+)", "\n".join(p.read_text() for p in pages.glob("*.md")), re.M
    )
    documented = {t.rsplit(".", 1)[-1] for t in targets}
    for target in targets:  # a module's directive documents its __all__
        try:
            documented |= set(getattr(importlib.import_module(target), "__all__", ()))
        except ImportError:
            pass
    module = importlib.import_module(package)
    shown = {
        n
        for n in module.__all__
        if (inspect.isclass(getattr(module, n)) or inspect.isfunction(getattr(module, n)))
        and n != "main"  # a command line's entry point: the CLI guide's
    }
    assert shown - documented == set()


def test_importing_the_package_does_not_import_torch() -> None:
    code = "import sys, torchbucket; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "False"


def test_unknown_names_raise_attribute_error() -> None:
    try:
        torchbucket.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
