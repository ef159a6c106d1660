"""Request accounting under its documented name: :mod:`torchbucket.runtime.accounting`.

``from torchbucket import accounting`` and ``import torchbucket.accounting``
give that module itself (one set of counters per process, not a copy).
"""

import sys

from torchbucket.runtime import accounting as _accounting
from torchbucket.runtime.accounting import *  # noqa: F403

sys.modules[__name__] = _accounting
