"""The benchmarks' harness: how runs under each latency preset are ordered and seeded."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

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


def test_listing_idle_floor_is_the_wait_until_a_second_round_answers() -> None:
    import listing

    # (sent, answered, client CPU then), from t0 = 10.0 and c0 = 1.0: the first
    # page answers at 0.06 s; the probe sent on it answers at 0.13 s, when the
    # client has spent 0.01 s of CPU; a piece sent later answers later.
    spans = [(10.0, 10.06, 1.005), (10.061, 10.13, 1.01), (10.07, 10.14, 1.02)]
    assert abs(listing.idle_floor(spans, 10.0, 1.0) - 0.12) < 1e-9
    # A request sent before the first page answered (blind) is not a second round.
    blind = [(10.0, 10.06, 1.005), (10.0, 10.061, 1.006), (10.061, 10.13, 1.01)]
    assert abs(listing.idle_floor(blind, 10.0, 1.0) - 0.12) < 1e-9
    # One page and done: nothing waited on past it.
    assert listing.idle_floor(spans[:1], 10.0, 1.0) == 0.0
    assert listing.idle_floor([], 10.0, 1.0) == 0.0


def test_sizes_slower_contenders_read_the_first_objects_by_a_prefix_that_lists_them() -> None:
    import dataloading as dl
    import sizes
    from torchbucket.emulator import generated_names

    ds = dl.DataSet("512b", 48_000, 512, 0)
    specs = {c.key: c.spec for c in sizes.contenders_for(ds, sizes.CONTENDERS)}
    # The peers, the bare loop and its DataLoader reference: slower than the defaults there.
    assert set(sizes.CAPPED) == {*sizes.PEERS, "aiohttp", "aiohttp_dl"}
    for key in sizes.CAPPED:
        assert specs[key]["count"] == sizes.PEER_OBJECTS
        prefix = specs[key]["list_prefix"]
        names = generated_names(dl.PREFIX, ds.count)
        # dataflux lists by prefix: exactly the first PEER_OBJECTS names.
        assert [n for n in names if n.startswith(prefix)] == names[: sizes.PEER_OBJECTS]
    # The others read every object; a size with fewer objects, the peers too.
    assert all("list_prefix" not in specs[k] for k in specs if k not in sizes.CAPPED)
    small = {
        c.key: c.spec
        for c in sizes.contenders_for(dl.DataSet("1mib", 2000, 1 << 20, 0), sizes.CONTENDERS)
    }
    assert all("list_prefix" not in spec and "count" not in spec for spec in small.values())


def test_the_expected_crcs_are_computed_once_per_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from _contenders import _common

    monkeypatch.setenv(_common.CRC_CACHE_ENV, str(tmp_path))
    names = _common.generated_names("sizes/", 5)
    first = _common.expected_crcs(names, 4096, seed=0)
    assert first == [_common.crc32c(_common.expected_bytes(n, 4096, 0)) for n in names]
    assert len(list(tmp_path.iterdir())) == 1

    def unread(*args: object) -> bytes:
        raise AssertionError("recomputed")

    # The next run of the same dataset reads the table; another size computes its own.
    monkeypatch.setattr(_common, "expected_bytes", unread)
    assert _common.expected_crcs(names, 4096, seed=0) == first
    with pytest.raises(AssertionError, match="recomputed"):
        _common.expected_crcs(names, 8192, seed=0)
    # Objects of many sizes are a dataset of their own, kept the same way.
    sizes = {n: 1000 + i for i, n in enumerate(names)}
    with pytest.raises(AssertionError, match="recomputed"):
        _common.expected_crcs(names, 0, seed=0, sizes=sizes)
    monkeypatch.undo()
    monkeypatch.setenv(_common.CRC_CACHE_ENV, str(tmp_path))
    varied = _common.expected_crcs(names, 0, seed=0, sizes=sizes)
    assert varied == [_common.crc32c(_common.expected_bytes(n, sizes[n], 0)) for n in names]
    assert len(list(tmp_path.iterdir())) == 2
    monkeypatch.setattr(_common, "expected_bytes", unread)
    assert _common.expected_crcs(names, 0, seed=0, sizes=sizes) == varied
    # A Verifier built from the table still tells a right body from a wrong one.
    verifier = _common.Verifier(names, 4096, seed=0)
    monkeypatch.undo()
    body = _common.expected_bytes(names[1], 4096, 0)
    assert verifier.check(body) == names[1]
    with pytest.raises(_common.VerifyError, match="corrupted"):
        verifier.check(body[:-1] + b"x")


def test_window_timeline_traces_another_object_size() -> None:
    import window_timeline

    assert window_timeline.parse_args(["--quick"]).size == 10 << 10
    args = window_timeline.parse_args(["--size-kib", "64", "--count", "18000"])
    assert (args.size, args.count, args.repeats) == (64 << 10, 18_000, 8)
    assert window_timeline.parse_args(["--size-kib", "0.5"]).size == 512  # sizes.py's 512 B
    for bad in ("0", "0.0001", "nan", "-1"):
        with pytest.raises(SystemExit):
            window_timeline.parse_args(["--size-kib", bad])


def test_a_verifier_of_objects_of_many_sizes_checks_each_ones_own() -> None:
    from _contenders import _common

    sizes = {"v/00002048/00000000": 2048, "v/00003000/00000000": 3000}
    names, verifier = _common.spec_objects({"sizes": sizes, "seed": 0})
    assert names == list(sizes)
    small, large = (_common.expected_bytes(n, s, 0) for n, s in sizes.items())
    assert verifier.check(large) == names[1]
    # A body cut to another object's length is refused, naming the object.
    with pytest.raises(_common.VerifyError, match="2047 bytes, expected 2048"):
        verifier.check(small[:-1])
    assert verifier.check(small) == names[0]
    assert verifier.finish() == 2 and verifier.bytes == 5048
    with pytest.raises(_common.VerifyError, match="delivered twice"):
        verifier.check(small)


def test_varied_sizes_spreads_its_sizes_and_names_them_as_the_emulator_does() -> None:
    import varied_sizes as vs
    from torchbucket.emulator import generated_names

    r = vs.Range("t", 2048, 30720, 600, 300)
    sizes = r.sizes()
    assert (len(set(sizes)), sizes[0], sizes[-1]) == (300, 2048, 30720)
    objects = r.objects()
    assert len(objects) == 600 and set(objects.values()) == set(sizes)
    assert generated_names(f"{vs.PREFIX}{sizes[5]:08d}/", 2) == [
        n for n, s in objects.items() if s == sizes[5]
    ]
    many = vs.Range("m", 2048, 30720, 30_000, 3_000).objects()
    loop = vs.limit_objects(many)
    assert len(loop) == vs.LIMIT_OBJECTS and loop == vs.limit_objects(many)
    assert loop != dict(list(many.items())[: vs.LIMIT_OBJECTS])  # shuffled, not the first
    assert vs.parse_args(["--quick"]).repeats == 3
    with pytest.raises(SystemExit):
        vs.parse_args(["--repeats", "0"])
