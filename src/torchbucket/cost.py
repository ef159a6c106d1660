"""Costs at list prices under their documented name: :mod:`torchbucket.runtime.cost`.

``from torchbucket import cost`` and ``import torchbucket.cost`` give that
module itself.
"""

import sys

from torchbucket.runtime import cost as _cost
from torchbucket.runtime.cost import *  # noqa: F403

sys.modules[__name__] = _cost
