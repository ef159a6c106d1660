"""The benchmarks' harness: how runs under each latency preset are ordered and seeded."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _harness as h
from torchbucket.emulator import PRESETS


class _Emulator:
    """Records what each run was set to."""

    def __init__(self) -> None:
        self.latency: Any = "unset"

    def set_latency(self, latency: Any) -> None:
        self.latency = latency


def test_every_run_starts_a_fresh_sampler_seeded_by_its_repeat() -> None:
    emu = _Emulator()
    seen: dict[tuple[int, str], list[Any]] = {}
    order = []
    for rep, preset, c in h.alternating_runs(
        emu, ["same-region", "same-region-tail"], 3, ["a", "b"]
    ):
        # Set again before every run, not once per preset and repeat: a
        # sampler shared by the contenders would give each different draws.
        assert emu.latency is not None
        seen.setdefault((rep, preset), []).append(emu.latency)
        order.append((rep, preset, c))
        emu.latency = "unset"
    tail = PRESETS["same-region-tail"]
    for rep in range(3):
        models = seen[(rep, "same-region-tail")]
        assert models == [models[0]] * 2  # every contender meets the same draws
        assert models[0].seed == tail.seed + rep  # and each repeat draws anew
        assert models[0].stall_probability == tail.stall_probability
    assert seen[(0, "same-region-tail")][0] != seen[(1, "same-region-tail")][0]
    # Presets alternate in order repeat by repeat.
    assert [o[1] for o in order[:4]] == ["same-region"] * 2 + ["same-region-tail"] * 2
    assert [o[1] for o in order[4:8]] == ["same-region-tail"] * 2 + ["same-region"] * 2


def test_no_latency_stays_none() -> None:
    assert h.reseeded(None, 3) is None
    assert h.reseeded("none", 3) is None
    assert h.reseeded(PRESETS["same-region"], 2).seed == PRESETS["same-region"].seed + 2
