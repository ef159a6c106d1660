"""The emulator's request-rate model (GCS's autoscaling), on a hand-driven clock."""

from __future__ import annotations

import pytest

from torchbucket.emulator import RATE_PRESETS, RequestRateModel
from torchbucket.emulator._ratemodel import RateState, rate_class, resolve_rate_model
from torchbucket.errors import ConfigError


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def drive(state: RateState, clock: Clock, rate: float, seconds: float, step: float = 0.05) -> None:
    """Offer ``rate`` reads per second for ``seconds``, in steps."""
    carry = 0.0
    for _ in range(round(seconds / step)):
        clock.t += step
        carry += rate * step
        n = int(carry)
        carry -= n
        state.admit("read", n)


def test_admits_the_capacity_and_refuses_the_rest_with_429() -> None:
    clock = Clock()
    state = RateState(RequestRateModel(read_rate=100, double_after=1000, burst=0.1), clock)
    drive(state, clock, 150, 10)
    line = state.timeline["read"]
    admitted = sum(w[1] for w in line[1:])
    refused429 = sum(w[2] for w in line[1:])
    assert admitted == pytest.approx(100 * (len(line) - 1), rel=0.03)
    assert refused429 == pytest.approx(50 * (len(line) - 1), rel=0.1)
    assert sum(w[3] for w in line) == 0  # 1.5x is no sudden jump
    assert state.capacity("read") == 100


def test_a_sudden_jump_is_answered_503() -> None:
    clock = Clock()
    state = RateState(RequestRateModel(read_rate=100, jump_factor=2.0), clock)
    clock.t += 1.0
    ok, r429, r503 = state.admit("read", 500)
    assert ok == 20  # the burst: 0.2 s of capacity
    assert r429 == 180  # offered up to 2x the capacity
    assert r503 == 300


def test_capacity_doubles_after_sustained_load_up_to_the_ceiling() -> None:
    clock = Clock()
    model = RequestRateModel(read_rate=100, double_after=5, ceiling=4.0, near=0.8)
    state = RateState(model, clock)
    drive(state, clock, 70, 20)  # below near x capacity: never grows
    assert state.capacity("read") == 100
    drive(state, clock, 1000, 7)
    assert state.capacity("read") == 200
    drive(state, clock, 1000, 30)
    assert state.capacity("read") == 400  # the ceiling
    assert state.capacity("write") == model.write_rate  # counted apart


def test_sequential_names_share_one_key_range_and_hashed_names_spread() -> None:
    clock = Clock()
    state = RateState(RequestRateModel(read_rate=800, key_ranges=8, burst=1.0), clock)
    clock.t += 1.0
    sequential = [f"train/{i:08d}" for i in range(400)]
    hashed = [f"{i * 2654435761 % 16**4:04x}/{i}" for i in range(400)]
    hexed = [f"{c}{d}/x" for c in "0123456789abcdef" for d in "0123456789abcdef"]
    assert len({state.key_range(n) for n in sequential}) == 1
    assert len({state.key_range(n) for n in hexed}) >= 3
    seq_ok = sum(state.check("get", n) == 0 for n in sequential)
    clock.t += 10.0
    hash_ok = sum(state.check("get", n) == 0 for n in hashed)
    assert seq_ok == 100  # one range: 1/8 of the capacity
    assert hash_ok > seq_ok


def test_classes_and_presets() -> None:
    assert rate_class("get") == "read"
    assert rate_class("put") == "write"
    assert rate_class("compose") == "write"
    assert rate_class("list") is None
    assert resolve_rate_model("gcs") == RATE_PRESETS["gcs"]
    assert RATE_PRESETS["gcs"].read_rate == 5000 and RATE_PRESETS["gcs"].write_rate == 1000
    assert resolve_rate_model({"read_rate": 10}) == RequestRateModel(read_rate=10)
    assert resolve_rate_model("none") is None
    with pytest.raises(ConfigError):
        resolve_rate_model("fast")
    with pytest.raises(ConfigError):
        RequestRateModel(near=0)
