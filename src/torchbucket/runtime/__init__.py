"""The runtime tier: what every request of every store goes through.

The user API is the process's event loop, run from synchronous code::

    from torchbucket import runtime

    objects = runtime.run(alist_objects(store, "train/"))

Its modules, which the layers above may use (``storage`` and up):
:mod:`.loop` (one background loop per process; ``run``/``submit`` below are
its), :mod:`.retry` (retries, backoff, the adaptive concurrency limit),
:mod:`.watchdog` (time limits of many requests on one timer),
:mod:`.tasks` (``gather_or_cancel``: many coroutines, none left behind),
:mod:`.accounting` (request counts, also :mod:`torchbucket.accounting`),
:mod:`.prices` (list prices and what counted requests cost at them, also
:mod:`torchbucket.cost`, whose plans per read strategy sit above the features
they count).
"""

from torchbucket.runtime.loop import (
    PARENT_CHECK_S,
    at_shutdown,
    get_loop,
    in_loop_thread,
    main_process_gone,
    run,
    shutdown,
    submit,
)

__all__ = [
    "PARENT_CHECK_S",
    "at_shutdown",
    "get_loop",
    "in_loop_thread",
    "main_process_gone",
    "run",
    "shutdown",
    "submit",
]
