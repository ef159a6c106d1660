"""The package version, in a module of its own so that any layer may import it.

Kept equal to ``[project] version`` in ``pyproject.toml``.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
