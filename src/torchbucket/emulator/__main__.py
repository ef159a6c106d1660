"""``python -m torchbucket.emulator``: see :mod:`torchbucket.emulator._cli`."""

from __future__ import annotations

import sys

from torchbucket.emulator._cli import main

if __name__ == "__main__":
    sys.exit(main())
