"""The mkdocs hook that renders the docstrings' Sphinx roles in the API reference."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "mkdocs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_roles_become_code_spans_and_a_closing_double_colon_one() -> None:
    html = (
        "<p>Build it with :meth:<code>from_prefix</code> and a "
        ":class:<code>~torchbucket.datasets.BucketBatchSampler</code> made for it::</p>"
        "<p>:func:<code>torchbucket.shards.pack</code> writes a::b key</p>"
    )
    out = _hooks().on_page_content(html, page=None, config=None, files=None)
    assert out == (
        "<p>Build it with <code>from_prefix</code> and a "
        "<code>BucketBatchSampler</code> made for it:</p>"
        "<p><code>torchbucket.shards.pack</code> writes a::b key</p>"
    )
    assert "mkdocs_hooks.py" in (ROOT / "mkdocs.yml").read_text()
