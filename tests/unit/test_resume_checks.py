"""``datasets.resumable.check_saved_state``: the one check of a saved state, for datasets and the sampler."""

from __future__ import annotations

import pytest

from torchbucket.datasets.resumable import check_saved_state
from torchbucket.errors import ConfigError

IDENTITY = {"seed": 3, "shuffle": True}


def _state(**changes: object) -> dict[str, object]:
    return {"version": 2, "seed": 3, "shuffle": True, "epoch": "4", "position": 5, **changes}


def test_a_state_of_the_same_order_gives_its_epoch_and_position() -> None:
    assert check_saved_state(_state(), version=2, identity=IDENTITY) == (4, 5)
    assert check_saved_state(_state(position=7), version=2, identity=IDENTITY, batches=7) == (4, 7)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"version": 1}, "unknown state version 1"),
        ({"seed": 4}, "state is for seed=4, this dataset has 3: resuming would replay"),
        ({"shuffle": None}, "state is for shuffle=None"),
        ({"epoch": -1}, "state has epoch -1 and position 5"),
        ({"position": -1}, "position -1"),
    ],
)
def test_another_state_is_refused_saying_why(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_saved_state(_state(**changes), version=2, identity=IDENTITY)


def test_the_sampler_names_itself_and_its_epoch_length() -> None:
    def check(state: dict[str, object]) -> tuple[int, int]:
        return check_saved_state(
            state,
            version=2,
            identity=IDENTITY,
            what="BucketBatchSampler state",
            holder="sampler",
            batches=4,
        )

    with pytest.raises(ConfigError, match="BucketBatchSampler state is for seed=9, this sampler"):
        check(_state(seed=9))
    with pytest.raises(ConfigError, match="position 5; an epoch here has 4 batches"):
        check(_state())
