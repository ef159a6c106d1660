"""The one resume check every resumable component passes.

``check_resumable(make)`` runs a component uninterrupted over a few epochs,
then, for each cut point, runs a fresh one up to the cut, takes
``state_dict()``, goes on a little (the state must be a snapshot, not a live
view), round-trips the state through pickle, loads it into another fresh
component and finishes the run. The samples after the cut must equal the
uninterrupted run's, one for one: nothing replayed, nothing skipped.

Cut points: before the first sample, mid first epoch, right after the last
sample of the first epoch (before the end is noticed), after the first epoch
has ended, and mid second epoch.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["check_resumable"]

_END_OF_EPOCH = "end"


def _no_epoch(obj: Any, epoch: int) -> None:
    del obj, epoch


def _run(
    obj: Any,
    epochs: range,
    set_epoch: Callable[[Any, int], None],
    key: Callable[[Any], Any],
    on_step: Callable[[int, int], bool] | None = None,
) -> list[tuple[int, Any]]:
    """Samples as (epoch, key); ``on_step(epoch, n_done)`` returning True stops."""
    out: list[tuple[int, Any]] = []
    for epoch in epochs:
        set_epoch(obj, epoch)
        iterator: Iterator[Any] = iter(obj)
        while True:
            if on_step is not None and on_step(epoch, len(out)):
                return out
            try:
                sample = next(iterator)
            except StopIteration:
                break
            out.append((epoch, key(sample)))
        if on_step is not None and on_step(epoch, -1):
            return out
    return out


def check_resumable(
    make: Callable[[], Any],
    *,
    epochs: int = 2,
    set_epoch: Callable[[Any, int], None] | None = None,
    key: Callable[[Any], Any] = lambda sample: sample,
    run_on_after_cut: int = 3,
) -> None:
    """Assert that ``make()``'s component resumes exactly at every cut point.

    Args:
        make: Builds a fresh component: iterable (each ``iter()`` is one
            epoch), with ``state_dict()`` and ``load_state_dict()``.
        epochs: Epochs in a run (>= 2, so a cut can cross a boundary).
        set_epoch: Called before each epoch's ``iter()``.
        key: Turns a sample into something comparable with ``==``.
        run_on_after_cut: Samples taken after ``state_dict()`` before the state
            is used, to catch a state that changes under its holder.
    """
    assert epochs >= 2
    set_epoch = set_epoch or _no_epoch
    reference = _run(make(), range(epochs), set_epoch, key)
    first = sum(1 for e, _ in reference if e == 0)
    second = sum(1 for e, _ in reference if e == 1)
    assert first > 2 and second > 2, "use a dataset of a few samples per epoch at least"
    cuts: list[int | str] = [0, first // 2, first, _END_OF_EPOCH, first + second // 2]

    for cut in cuts:
        state, done_at, resume_epoch = _snapshot_at(
            make, cut, first, epochs, set_epoch, key, run_on_after_cut
        )
        resumed_obj = make()
        resumed_obj.load_state_dict(state)
        resumed = _run(resumed_obj, range(resume_epoch, epochs), set_epoch, key)
        expected = reference[done_at:]
        assert resumed == expected, (
            f"resuming at cut {cut!r} (sample {done_at}, epoch {resume_epoch}) gave "
            f"{len(resumed)} samples, expected {len(expected)}; first difference at "
            f"{next((i for i, (a, b) in enumerate(zip(resumed, expected)) if a != b), None)}"
        )


class _Cut:
    """Decides, step by step, when to take the state and when to stop."""

    def __init__(self, holder: Any, cut: int | str, first: int, run_on: int) -> None:
        self.holder = holder
        self.cut = cut
        self.first = first
        self.run_on = run_on
        self.state: dict[str, Any] | None = None
        self.done_at = 0
        self.resume_epoch = 0

    def __call__(self, epoch: int, n_done: int) -> bool:
        if self.state is not None:
            return n_done < 0 or n_done >= self.done_at + self.run_on
        at_end = self.cut == _END_OF_EPOCH and epoch == 0 and n_done < 0
        if not at_end and not (n_done >= 0 and n_done == self.cut):
            return False
        # Through pickle, as a checkpoint would carry it.
        self.state = pickle.loads(pickle.dumps(self.holder.state_dict()))
        self.resume_epoch = epoch + 1 if at_end else epoch
        self.done_at = self.first if at_end else int(self.cut)
        return at_end


def _snapshot_at(
    make: Callable[[], Any],
    cut: int | str,
    first: int,
    epochs: int,
    set_epoch: Callable[[Any, int], None],
    key: Callable[[Any], Any],
    run_on: int,
) -> tuple[dict[str, Any], int, int]:
    cutter = _Cut(make(), cut, first, run_on)
    _run(cutter.holder, range(epochs), set_epoch, key, cutter)
    assert cutter.state is not None, f"cut {cut!r} was never reached"
    return cutter.state, cutter.done_at, cutter.resume_epoch
