"""The emulator's latency model as a distribution: seeded draws, quantiles, stalls.

Statistics of the model itself (many draws from the sampler), never a timing
of this machine.
"""

from __future__ import annotations

import math
import statistics

import pytest

from torchbucket.emulator import PRESETS, LatencyModel
from torchbucket.emulator._latency import LatencySampler, resolve_latency
from torchbucket.errors import ConfigError

DRAWS = 100_000


def _draws(model: LatencyModel, op: str = "get", n: int = DRAWS) -> list[float]:
    sampler = LatencySampler(model)
    return [sampler.first_byte(op) for _ in range(n)]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def test_the_constant_preset_stays_constant() -> None:
    model = resolve_latency("same-region")
    assert model is not None and model.constant
    assert set(_draws(model, "get", 1000)) == {model.read}
    assert set(_draws(model, "list", 1000)) == {model.list_page}
    assert set(_draws(model, "put", 1000)) == {model.write}


def test_the_same_seed_draws_the_same_times_and_another_seed_others() -> None:
    model = LatencyModel(tail_p99=5.0, stall_probability=0.01, stall_seconds=1.0, seed=7)
    assert _draws(model, n=500) == _draws(model, n=500)
    other = LatencyModel(tail_p99=5.0, stall_probability=0.01, stall_seconds=1.0, seed=8)
    assert _draws(model, n=500) != _draws(other, n=500)


@pytest.mark.parametrize("op, median", [("get", 0.020), ("list", 0.060), ("put", 0.040)])
def test_the_tail_preset_has_its_documented_shape(op: str, median: float) -> None:
    model = PRESETS["same-region-tail"]
    draws = _draws(model, op)
    # Body: the class's median, and a p99 of 5x it (before stalls, which are
    # 1 in 1,000 and so move neither quantile by more than a hair).
    assert _quantile(draws, 0.5) == pytest.approx(median, rel=0.03)
    assert _quantile(draws, 0.99) / _quantile(draws, 0.5) == pytest.approx(5.0, rel=0.08)
    assert _quantile(draws, 0.95) / _quantile(draws, 0.5) == pytest.approx(
        math.exp(math.log(5.0) / 2.3263 * 1.6449), rel=0.05
    )
    # Stalls: 1 in 1,000 adds 2 s (binomial: 100 expected, sd 10).
    stalls = sum(1 for d in draws if d >= model.stall_seconds)
    assert 60 <= stalls <= 140
    # Nothing is faster than zero; the body's p99.9 is ~8.5x the median.
    assert min(draws) > 0
    body = [d for d in draws if d < model.stall_seconds]
    assert 7 * median < _quantile(body, 0.999) < 10 * median


def test_a_configured_tail_sets_the_p99_as_a_multiple_of_the_median() -> None:
    for tail in (2.0, 10.0):
        draws = _draws(LatencyModel(read=0.010, tail_p99=tail, seed=3))
        assert _quantile(draws, 0.99) / statistics.median(draws) == pytest.approx(tail, rel=0.1)


def test_stalls_come_at_their_probability_and_length() -> None:
    model = LatencyModel(read=0.001, stall_probability=0.05, stall_seconds=0.5, seed=1)
    draws = _draws(model)
    stalled = [d for d in draws if d > 0.25]
    assert len(stalled) / len(draws) == pytest.approx(0.05, abs=0.005)
    assert all(d == pytest.approx(0.501) for d in stalled)


def test_bandwidth_adds_the_transfer_and_has_no_tail() -> None:
    model = LatencyModel(read=0.0, bandwidth=1e6, tail_p99=5.0, seed=2)
    sampler = LatencySampler(model)
    assert {sampler.delay("get", 0, 1_000_000) for _ in range(100)} == {1.0}


def test_the_model_crosses_the_admin_api_as_its_fields() -> None:
    model = PRESETS["same-region-tail"]
    assert resolve_latency(model.to_dict()) == model


@pytest.mark.parametrize(
    "fields",
    [{"tail_p99": 0.5}, {"stall_probability": 1.5}, {"stall_seconds": -1.0}, {"read": -0.1}],
)
def test_bad_shapes_are_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        LatencyModel(**fields)


def test_a_stall_falls_before_or_after_the_request_is_applied_with_equal_chance() -> None:
    # Before: the server holds the request, then applies it; after: it applies
    # it and holds the answer. A client can count on neither.
    model = LatencyModel(write=0.04, stall_probability=1.0, stall_seconds=0.5, seed=3)
    sampler = LatencySampler(model)
    splits = []
    for _ in range(10_000):
        splits.append(sampler.first_byte_split("put"))
        # The sampler says where the stall fell, for the server's counters.
        assert sampler.last_stall == ("before" if splits[-1][0] else "after")
    before = [(b, a) for b, a in splits if b]
    after = [(b, a) for b, a in splits if not b]
    assert len(before) / len(splits) == pytest.approx(0.5, abs=0.02)
    assert all(b == 0.5 and a == pytest.approx(0.04) for b, a in before)
    assert all(a == pytest.approx(0.54) for _, a in after)
    quiet = LatencySampler(LatencyModel(tail_p99=5.0, seed=1))
    assert all(quiet.first_byte_split("put")[0] == 0.0 for _ in range(1000))
    assert quiet.last_stall is None
