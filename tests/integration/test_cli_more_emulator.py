"""``torchbucket mb``, ``rm``, ``cat``, and the rough edges of ls and errors, on the emulator."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from torchbucket import runtime
from torchbucket.cli import main
from torchbucket.emulator import Emulator
from torchbucket.errors import BucketExistsError
from torchbucket.storage.gcs import GCSConfig, GCSStore

pytestmark = pytest.mark.emulator


@pytest.fixture
def bucket(emulator: Emulator, gcs_bucket_factory: Callable[..., Any]) -> Any:
    return gcs_bucket_factory(emulator, prefix="cli")


def run(emulator: Emulator, *argv: str) -> int:
    return main(["--endpoint", emulator.endpoint, "--deadline", "20", *argv])


def one_line_error(err: str, *needles: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("torchbucket: error: ")
    for needle in needles:
        assert needle in lines[0], err
    return lines[0]


def exists(emulator: Emulator, name: str) -> bool | None:
    store = GCSStore(name, config=GCSConfig(endpoint=emulator.endpoint, anonymous=True))
    try:
        return runtime.run(store.bucket_exists())
    finally:
        runtime.run(store.close())


# ---------------------------------------------------------------- mb


def test_mb_makes_a_bucket_that_cp_can_then_write_to(
    emulator: Emulator, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"mb-{uuid.uuid4().hex[:12]}"
    assert exists(emulator, name) is False
    assert run(emulator, "mb", f"gs://{name}") == 0
    assert capsys.readouterr().out == f"created gs://{name}/\n"
    assert exists(emulator, name) is True
    (tmp_path / "a.txt").write_bytes(b"hello")
    assert run(emulator, "cp", str(tmp_path / "a.txt"), f"gs://{name}/train/") == 0
    assert emulator.object_names(name) == ["train/a.txt"]


def test_mb_of_a_bucket_that_exists_is_a_clear_error(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(emulator, "mb", f"gs://{bucket.bucket}") == 1
    one_line_error(capsys.readouterr().err, f"gs://{bucket.bucket}/", "already own it", "409")


def test_mb_takes_a_bucket_not_an_object(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(emulator, "mb", "gs://some-bucket/train/") == 2
    one_line_error(capsys.readouterr().err, "mb takes a bucket")


def test_a_missing_bucket_says_how_to_make_it(
    emulator: Emulator, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"missing-{uuid.uuid4().hex[:12]}"
    assert run(emulator, "ls", f"gs://{name}/train/") == 3
    line = one_line_error(capsys.readouterr().err, f"torchbucket mb gs://{name}")
    assert line.lower().count("does not exist") == 1
    (tmp_path / "a.txt").write_bytes(b"hello")
    assert run(emulator, "cp", str(tmp_path / "a.txt"), f"gs://{name}/train/") == 3
    line = one_line_error(capsys.readouterr().err, f"torchbucket mb gs://{name}")
    assert line.lower().count("does not exist") == 1


def test_the_gcs_store_creates_its_bucket(emulator: Emulator) -> None:
    name = f"mb-{uuid.uuid4().hex[:12]}"
    store = GCSStore(name, config=GCSConfig(endpoint=emulator.endpoint, anonymous=True))
    try:
        assert runtime.run(store.bucket_exists()) is False
        runtime.run(store.create_bucket(location="EU"))
        assert runtime.run(store.bucket_exists()) is True
        runtime.run(store.put("k", b"v"))
        with pytest.raises(BucketExistsError) as info:
            runtime.run(store.create_bucket())
        assert info.value.status == 409
    finally:
        runtime.run(store.close())


# ---------------------------------------------------------------- rm


def test_rm_deletes_one_object(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.seed(bucket.bucket, {"a/x": b"1", "a/y": b"2"})
    assert run(emulator, "rm", f"gs://{bucket.bucket}/a/x") == 0
    assert capsys.readouterr().out == f"removed gs://{bucket.bucket}/a/x\n"
    assert emulator.object_names(bucket.bucket) == ["a/y"]
    assert run(emulator, "rm", f"gs://{bucket.bucket}/a/x") == 3
    one_line_error(capsys.readouterr().err, f"gs://{bucket.bucket}/a/x")


def test_rm_of_a_prefix_needs_r(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.seed(bucket.bucket, {"a/x": b"1"})
    assert run(emulator, "rm", f"gs://{bucket.bucket}/a/") == 2
    one_line_error(capsys.readouterr().err, "rm -r")
    assert emulator.object_names(bucket.bucket) == ["a/x"]


def test_rm_r_without_a_terminal_or_yes_deletes_nothing(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.seed(bucket.bucket, {f"run/{i}": b"x" * 10 for i in range(5)})
    assert run(emulator, "rm", "-r", f"gs://{bucket.bucket}/run/") == 2
    one_line_error(capsys.readouterr().err, "5 objects", "--yes")
    assert len(emulator.object_names(bucket.bucket)) == 5


def test_rm_r_yes_deletes_the_folder_and_nothing_beside_it(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    objects = {f"run/{i:03d}": b"x" for i in range(150)} | {"run": b"r", "run-2/keep": b"k"}
    emulator.seed(bucket.bucket, objects)
    assert run(emulator, "rm", "-r", "-y", f"gs://{bucket.bucket}/run") == 0
    assert capsys.readouterr().out == f"removed 151 objects under gs://{bucket.bucket}/run\n"
    assert emulator.object_names(bucket.bucket) == ["run-2/keep"]


def test_rm_r_deletes_folder_placeholders_and_staging_objects_too(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # A dataset's listing leaves these out; `rm -r` leaves nothing under the prefix.
    objects = {
        "run/": b"",
        "run/sub/": b"",
        "run/a.pt": b"a",
        "run/.a.pt.tbtmp-0123456789abcdef": b"staged",
        "keep/": b"",
    }
    emulator.seed(bucket.bucket, objects)
    assert run(emulator, "rm", "-r", "-y", f"gs://{bucket.bucket}/run/") == 0
    assert capsys.readouterr().out == f"removed 4 objects under gs://{bucket.bucket}/run/\n"
    assert emulator.object_names(bucket.bucket) == ["keep/"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("answer", "left"), [("y\n", 0), ("n\n", 3), ("\n", 3)])
def test_rm_r_on_a_terminal_asks_first(
    emulator: Emulator,
    bucket: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    answer: str,
    left: int,
) -> None:
    emulator.seed(bucket.bucket, {f"tmp/{i}": b"x" for i in range(3)})
    monkeypatch.setattr(sys, "stdin", _Terminal(answer))
    code = run(emulator, "rm", "-r", f"gs://{bucket.bucket}/tmp/")
    assert (
        f"delete 3 objects (3 B) under gs://{bucket.bucket}/tmp/? [y/N]" in capsys.readouterr().err
    )
    assert code == (0 if left == 0 else 2)
    assert len(emulator.object_names(bucket.bucket)) == left


# ---------------------------------------------------------------- cat


def test_cat_writes_the_bytes_and_ranges_of_objects(emulator: Emulator, bucket: Any) -> None:
    data = os.urandom(3 << 20)
    emulator.seed(bucket.bucket, {"blob": data, "small": b"0123456789"})

    def cat(*argv: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "torchbucket", "--endpoint", emulator.endpoint, "cat", *argv],
            capture_output=True,
            timeout=60,
        )

    assert cat(f"gs://{bucket.bucket}/blob").stdout == data
    assert cat("-r", "2-4", f"gs://{bucket.bucket}/small").stdout == b"234"
    assert cat("-r", "7-", f"gs://{bucket.bucket}/small").stdout == b"789"
    assert cat("-r", "-3", f"gs://{bucket.bucket}/small").stdout == b"789"
    both = cat(f"gs://{bucket.bucket}/small", f"gs://{bucket.bucket}/small")
    assert both.stdout == b"0123456789" * 2
    missing = cat(f"gs://{bucket.bucket}/nope")
    assert missing.returncode == 3
    one_line_error(missing.stderr.decode(), f"gs://{bucket.bucket}/nope")
    bad = cat("-r", "5-2", f"gs://{bucket.bucket}/small")
    assert bad.returncode == 2 and b"ends before it starts" in bad.stderr


# ---------------------------------------------------------------- ls -H, credentials


def test_ls_h_alone_shows_human_sizes(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.seed(bucket.bucket, {"d/big": b"x" * 3072, "d/small": b"y"})
    assert run(emulator, "ls", "-H", f"gs://{bucket.bucket}/d/") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["3", "KiB", f"gs://{bucket.bucket}/d/big"]
    assert lines[1].split() == ["1", "B", f"gs://{bucket.bucket}/d/small"]
    assert lines[2] == "TOTAL: 2 objects, 3073 bytes (3 KiB)"


def test_no_credentials_points_to_what_the_command_line_can_set(tmp_path: Any) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STORAGE_EMULATOR", "TORCHBUCKET_GCS"))
    }
    env["GOOGLE_APPLICATION_CREDENTIALS"] = str(tmp_path / "no-such-key.json")
    result = subprocess.run(
        [sys.executable, "-m", "torchbucket", "ls", "gs://some-public-bucket/data/"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 4, result.stderr
    line = one_line_error(result.stderr, "TORCHBUCKET_GCS_ANONYMOUS=1", "STORAGE_EMULATOR_HOST")
    assert "gcloud auth application-default login" in line
