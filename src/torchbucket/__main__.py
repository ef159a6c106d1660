"""``python -m torchbucket``: the command line (see :mod:`torchbucket.cli`)."""

from __future__ import annotations

import sys

from torchbucket.cli import main

if __name__ == "__main__":
    sys.exit(main())
