from __future__ import annotations

import subprocess
import sys

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
