"""dataflux-style user scripts (tests/dataflux_scripts) run unchanged against the emulator.

Each script is what a gcs-torch-dataflux 1.4.0 user wrote, with only its
imports moved to ``torchbucket.dataflux``; it runs in its own process with
``STORAGE_EMULATOR_HOST`` set, as a user's job would, and prints what it got.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from _torchrun import torchrun

from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

SCRIPTS = Path(__file__).resolve().parents[1] / "dataflux_scripts"
PREFIX = "train/"
N = 10


def contents(i: int) -> str:
    return f"sample-{i:02d}"


@pytest.fixture
def bucket(emulator: Emulator) -> str:
    name = f"df-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    emulator.seed(name, {f"{PREFIX}{i:02d}": contents(i).encode() for i in range(N)})
    emulator.seed(name, {"other/0": b"not under the prefix"})
    return name


def environment(emulator: Emulator, bucket: str) -> dict[str, str]:
    return {
        **os.environ,
        "STORAGE_EMULATOR_HOST": emulator.endpoint,
        "PROJECT_NAME": "my-project",
        "BUCKET_NAME": bucket,
        "PREFIX": PREFIX,
    }


def run_script(emulator: Emulator, bucket: str, name: str) -> Any:
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / name)],
        env=environment(emulator, bucket),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def expected_objects() -> list[list[Any]]:
    return [[f"{PREFIX}{i:02d}", len(contents(i))] for i in range(N)]


def test_map_style_script(emulator: Emulator, bucket: str) -> None:
    got = run_script(emulator, bucket, "mapstyle.py")
    assert got["first"] == [f"{PREFIX}00", len(contents(0))]
    assert got["objects"] == expected_objects()
    assert got["contents"] == [contents(i) for i in range(N)]
    assert got["subset"] == [contents(i) for i in range(3)]
    assert got["empty"] == 0


def test_iterable_script_with_compose_off_positionally(emulator: Emulator, bucket: str) -> None:
    emulator.reset_stats()
    got = run_script(emulator, bucket, "iterable.py")
    assert got["objects"] == expected_objects()
    assert got["single"] == [contents(i) for i in range(N)]
    assert sorted(got["workers"]) == [contents(i) for i in range(N)]
    assert got["max_composite_object_size"] == 0
    # The user turned compose off: no composite was made.
    assert not [op for op in emulator.stats()["by_op"] if "compose" in op]
    assert emulator.object_names(bucket, "dataflux-composed-objects/") == []


def test_checkpoint_script(emulator: Emulator, bucket: str) -> None:
    got = run_script(emulator, bucket, "checkpoint.py")
    assert got["same"] is True
    assert "checkpoints/epoch0.ckpt" in emulator.object_names(bucket, "checkpoints/")


def test_lightning_script_with_both_plugins(emulator: Emulator, bucket: str) -> None:
    pytest.importorskip("lightning")
    got = run_script(emulator, bucket, "lightning_trainer.py")
    assert got == {"global_step": 3, "same": True, "async_global_step": 4, "async_same": True}
    assert "checkpoints/ckpt.ckpt" in emulator.object_names(bucket, "checkpoints/")
    assert "async/epoch=0-step=4.ckpt" in emulator.object_names(bucket, "async/")


def test_dcp_script_on_two_ranks(
    emulator: Emulator, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in environment(emulator, bucket).items():
        if key not in os.environ or os.environ[key] != value:
            monkeypatch.setenv(key, value)
    ranks = torchrun(SCRIPTS / "dcp_save_load.py", str(tmp_path), out=tmp_path)
    assert ranks == [
        {"model_same": True, "own": [1.0] * 4, "extra": {"epoch": 3}},
        {"model_same": True, "own": [2.0] * 4, "extra": {"epoch": 3}},
    ]
    names = emulator.object_names(bucket, "dcp/step-1/")
    assert "dcp/step-1/.metadata" in names and "dcp/step-1/extra.pt" in names
