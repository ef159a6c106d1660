"""``torchbucket cost`` and ``--stats`` against the emulator over HTTP."""

from __future__ import annotations

import json
import re
import uuid

import pytest

from torchbucket.cli import main
from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator


def _bucket(emu: Emulator, soft_delete_seconds: int = 0) -> str:
    name = f"cost-{uuid.uuid4().hex[:12]}"
    emu.create_bucket(name, soft_delete_seconds=soft_delete_seconds)
    emu.seed(name, {f"train/{i:05d}": b"x" * 1000 for i in range(2500)})
    return name


def test_cost_plans_each_strategy_with_the_buckets_soft_delete(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = _bucket(emulator, 7 * 86400)
    argv = ["--endpoint", emulator.endpoint, "cost", f"gs://{bucket}/train/", "--epochs", "10"]
    assert main([*argv, "--ranks", "2", "--workers", "2", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["objects"] == 2500 and plan["soft_delete_seconds"] == 7 * 86400
    by = {s["strategy"]: s for s in plan["strategies"]}
    assert set(by) == {"direct", "compose", "shards"}
    assert by["direct"]["per_epoch"]["by_class"]["B"] == 2500
    assert by["compose"]["retained_bytes_run"] > 0
    assert "OFF by default" in by["compose"]["note"]
    # The run costs every epoch plus what is done once (listing; packing).
    assert by["direct"]["run_usd"] == pytest.approx(
        10 * by["direct"]["epoch_usd"] + by["direct"]["once"]["by_class"]["A"] * 0.005 / 1000
    )
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert re.search(r"^direct\s+0\s+2,500\s", table, re.M), table
    assert "soft delete 7 days (read from the bucket)" in table


def test_stats_prints_the_requests_the_command_made(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = _bucket(emulator)
    emulator.reset_stats()
    assert main(["--endpoint", emulator.endpoint, "ls", "--stats", f"gs://{bucket}/train/"]) == 0
    err = capsys.readouterr().err
    server = emulator.stats()
    found = re.search(r"requests: (\d+) \(class A (\d+), class B (\d+)", err)
    assert found is not None, err
    assert int(found.group(1)) == server["requests"] > 0
    assert int(found.group(2)) == server["by_class"]["A"]
    assert int(found.group(3)) == server["by_class"]["B"]
    assert "at list prices" in err


def test_cost_reads_the_listing_cache_instead_of_listing(
    emulator: Emulator, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    bucket = _bucket(emulator)
    cache = f"{tmp_path}/train.json.gz"
    argv = ["--endpoint", emulator.endpoint, "cost", f"gs://{bucket}/train/", "--cache", cache]
    emulator.reset_stats()
    assert main([*argv, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert emulator.stats()["by_op"].get("list", 0) >= 3  # 2,500 objects: listed
    emulator.reset_stats()
    assert main([*argv, "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert emulator.stats()["by_op"].get("list", 0) == 0  # read from the manifest
    assert second["objects"] == first["objects"] == 2500
    by = {s["strategy"]: s for s in second["strategies"]}
    assert by["direct"]["once"]["by_class"]["A"] == 0  # the job's listing is cached too
    assert main(argv) == 0
    assert f"listing read from the cache {cache}" in capsys.readouterr().out


def test_bench_prints_its_requests_by_class_and_their_cost(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = _bucket(emulator)
    emulator.reset_stats()
    argv = ["--endpoint", emulator.endpoint, "bench", f"gs://{bucket}/scratch/"]
    assert main([*argv, "--small-count", "20", "--large-size", "1MiB"]) == 0
    out = capsys.readouterr().out
    server = emulator.stats()["by_class"]
    found = re.search(r"^requests: (\d+) class A, (\d+) class B, (\d+) free", out, re.M)
    assert found is not None, out
    assert [int(g) for g in found.groups()] == [server["A"], server["B"], server["free"]]
    assert re.search(r"^cost: +\$\d+\.\d{4} at list prices", out, re.M), out
