"""Rough edges a first-time user met (issue 39), each with what they see now."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from torchbucket import (
    BucketBatchSampler,
    BucketIterableDataset,
    BucketMapDataset,
    BucketShardDataset,
    runtime,
)
from torchbucket.cli import main
from torchbucket.errors import BucketNotFoundError, ConfigError, NotFoundError
from torchbucket.storage import MemoryStore
from torchbucket.storage.gcs._errors import error_for_response
from torchbucket.storage.memory import delete_memory_bucket


def test_a_missing_bucket_is_said_once() -> None:
    # GCS's own answer to a listing of a bucket that does not exist.
    body = json.dumps(
        {
            "error": {
                "code": 404,
                "message": "The specified bucket my-bucket does not exist.",
                "errors": [{"reason": "notFound"}],
            }
        }
    ).encode()
    error = error_for_response(
        404, {}, body, operation="list", uri="gs://my-bucket/", bucket_op=True
    )
    assert isinstance(error, BucketNotFoundError)
    assert (
        str(error)
        == "list gs://my-bucket/: The specified bucket my-bucket does not exist. (HTTP 404)"
    )
    assert str(error).lower().count("does not exist") == 1


# ---------------------------------------------------------------- emulator --help


def test_emulator_help_has_examples_and_says_the_port_changes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["emulator", "--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out
    assert "torchbucket emulator --bucket my-bucket" in out
    assert "export STORAGE_EMULATOR_HOST=" in out
    assert "different on every start" in out


# ---------------------------------------------------------------- flags that must be bools


@pytest.mark.parametrize("value", ["yes", "no", 1, None])
def test_shuffle_must_be_a_bool(value: object) -> None:
    bucket = f"rough-{uuid.uuid4().hex[:8]}"
    runtime.run(MemoryStore(bucket).put("d/a", b"x"))
    try:
        with pytest.raises(ConfigError, match="shuffle must be True or False"):
            BucketIterableDataset.from_prefix(f"memory://{bucket}/d/", shuffle=value)  # type: ignore[arg-type]
        dataset = BucketMapDataset.from_prefix(f"memory://{bucket}/d/")
        with pytest.raises(ConfigError, match="BucketBatchSampler: shuffle"):
            BucketBatchSampler(dataset, batch_size=1, shuffle=value)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="shuffle must be True or False"):
            BucketShardDataset.from_prefix(f"memory://{bucket}/d/", shuffle=value)  # type: ignore[arg-type]
    finally:
        delete_memory_bucket(bucket)


def test_numpy_bools_are_bools() -> None:
    bucket = f"rough-{uuid.uuid4().hex[:8]}"
    runtime.run(MemoryStore(bucket).put("d/a", b"x"))
    try:
        dataset = BucketIterableDataset.from_prefix(f"memory://{bucket}/d/", shuffle=np.bool_(True))  # type: ignore[arg-type]
        assert list(dataset) == [b"x"]
    finally:
        delete_memory_bucket(bucket)


# ---------------------------------------------------------------- local paths


def _tree(root: Path) -> None:
    (root / "train").mkdir()
    (root / "train2").mkdir()
    (root / "train" / "a.bin").write_bytes(b"a")
    (root / "train" / "b.bin").write_bytes(b"bb")
    (root / "train2" / "c.bin").write_bytes(b"ccc")


def test_datasets_take_a_path_or_a_plain_local_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path)
    expected = [b"a", b"bb"]  # train/ only: not train2/, whose name starts the same
    assert list(BucketIterableDataset.from_prefix(tmp_path / "train")) == expected
    assert list(BucketIterableDataset.from_prefix(str(tmp_path / "train"))) == expected
    mapped = BucketMapDataset.from_prefix(tmp_path / "train")
    assert [mapped[i] for i in range(len(mapped))] == expected
    assert mapped.uri(0) == f"file://{tmp_path}/train/a.bin"
    monkeypatch.chdir(tmp_path)
    assert list(BucketIterableDataset.from_prefix("train/")) == expected
    objects = BucketMapDataset.from_objects([tmp_path / "train2" / "c.bin", "train/a.bin"])
    assert [objects[0], objects[1]] == [b"ccc", b"a"]


def test_a_missing_local_path_names_the_file_uri(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError) as info:
        BucketMapDataset.from_prefix(tmp_path / "nothing-here")
    assert f"file://{tmp_path}/nothing-here" in str(info.value)


def test_an_emulator_on_a_busy_port_says_so_in_one_line() -> None:
    # What a user meets running the README's `torchbucket emulator --port 4443 &`
    # a second time, the first one still running.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "torchbucket", "emulator", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(port) in lines[0] and "already running" in lines[0] and "--port" in lines[0]


# ---------------------------------------------------------------- demo without Pillow


def test_demo_without_pillow_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['PIL'] = None\n"
        "from torchbucket.cli import main\n"
        "sys.exit(main(['demo', '--quick']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "needs pillow" in lines[0]
    assert "pip install 'torchbucket[demo]'" in lines[0]
    assert "No module named" not in result.stderr
