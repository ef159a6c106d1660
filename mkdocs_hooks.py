"""mkdocs hooks: render the docstrings' Sphinx roles as plain code spans.

The docstrings cross-reference with reST roles (``:class:`~pkg.Name```,
``:meth:`name```) and end a line before a literal block with ``::``.
mkdocstrings renders Markdown, so without this the API reference shows
":class:~torchbucket.datasets.BucketBatchSampler" and "made for this dataset::"
as written. Here a role becomes its code span (``~pkg.Name`` -> ``Name``, as
Sphinx shows it) and a paragraph's closing ``::`` one colon.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj):<code>(~?)([^<]*)</code>")


def _code_span(match: re.Match[str]) -> str:
    tilde, name = match.groups()
    return f"<code>{name.rsplit('.', 1)[-1] if tilde else name}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    """Rewrite the roles and the ``::`` of one rendered page."""
    return _ROLE.sub(_code_span, html).replace("::</p>", ":</p>")
