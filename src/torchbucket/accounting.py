"""Request accounting under its documented name: :mod:`torchbucket.runtime.accounting`'s API.

``from torchbucket import accounting`` gives the same functions and classes as
that module, so the same counters (one set per process, not a copy)::

    from torchbucket import accounting

    with accounting.measure() as m:
        ...
    print(m.stats.summary())

To replace a counter (a benchmark without accounting), patch
:mod:`torchbucket.runtime.accounting`, the module the stores call.
"""

from __future__ import annotations

from torchbucket.runtime.accounting import (
    OP_CLASS,
    OPERATIONS,
    Measurement,
    RequestStats,
    all_ranks,
    budget_status,
    classify,
    measure,
    snapshot,
)

__all__ = [
    "OPERATIONS",
    "OP_CLASS",
    "Measurement",
    "RequestStats",
    "all_ranks",
    "budget_status",
    "classify",
    "measure",
    "snapshot",
]
