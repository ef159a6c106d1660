"""The command line against the local GCS emulator, in-process and as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from torchbucket import runtime
from torchbucket.cli import main
from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

COMPOSED = "dataflux-composed-objects/"


@pytest.fixture
def bucket(emulator: Emulator, gcs_bucket_factory: Callable[..., Any]) -> Any:
    return gcs_bucket_factory(emulator, prefix="cli")


def run(emulator: Emulator, *argv: str) -> int:
    return main(["--endpoint", emulator.endpoint, "--deadline", "20", *argv])


def one_line_error(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("torchbucket: error: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], err


def test_cp_round_trip_through_a_bucket_keeps_every_byte(
    emulator: Emulator, bucket: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    files = {f"cls{i % 3}/{i:04d}.png": os.urandom(100 + i) for i in range(120)}
    files["big.bin"] = os.urandom(3 << 20)
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    uri = f"gs://{bucket.bucket}/train/"

    assert run(emulator, "cp", "--stream-threshold", "1MiB", str(src), uri) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"copied 121 objects, {sum(map(len, files.values()))} bytes")
    assert sorted(emulator.object_names(bucket.bucket)) == sorted("train/" + k for k in files)

    dst = tmp_path / "dst"
    assert run(emulator, "cp", "--stream-threshold", "1MiB", uri, str(dst)) == 0
    back = {p.relative_to(dst).as_posix(): p.read_bytes() for p in dst.rglob("*") if p.is_file()}
    assert back == files


def test_ls_and_du_over_a_bucket(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.seed(
        bucket.bucket,
        {f"ds/train/{i:05d}": b"x" * 10 for i in range(2500)}
        | {f"ds/val/{i:05d}": b"y" * 4 for i in range(30)}
        | {f"{COMPOSED}leftover": b"z"},
    )
    assert run(emulator, "ls", f"gs://{bucket.bucket}/ds/") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2530
    assert lines[0] == f"gs://{bucket.bucket}/ds/train/00000"
    assert lines[-1] == f"gs://{bucket.bucket}/ds/val/00029"

    assert run(emulator, "ls", "-l", f"gs://{bucket.bucket}/ds/val/") == 0
    assert capsys.readouterr().out.splitlines()[-1] == "TOTAL: 30 objects, 120 bytes (120 B)"

    assert run(emulator, "du", f"gs://{bucket.bucket}/") == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [(r[0], r[2], r[-1]) for r in rows] == [
        ("2530", "25120", f"gs://{bucket.bucket}/ds/"),
        ("2530", "25120", f"gs://{bucket.bucket}/"),
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "gs://{missing}/x/"],
        ["du", "gs://{missing}/"],
        ["cp", "gs://{missing}/x/", "{tmp}/out"],
        ["cp", "{tmp}", "gs://{missing}/up/"],
        ["cleanup", "gs://{missing}/"],
        ["bench", "--small-count", "2", "--large-size", "0", "gs://{missing}/"],
    ],
    ids=["ls", "du", "cp-download", "cp-upload", "cleanup", "bench"],
)
def test_a_missing_bucket_is_not_found_in_one_line(
    emulator: Emulator, argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "f").write_bytes(b"x")
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    argv = [a.format(missing=missing, tmp=tmp_path) for a in argv]
    assert run(emulator, *argv) == 3
    captured = capsys.readouterr()
    one_line_error(captured.err, f"gs://{missing}/")
    assert not (tmp_path / "out").exists()


def test_an_empty_prefix_is_not_found(
    emulator: Emulator, bucket: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.seed(bucket.bucket, {"data/a": b"x"})
    for argv in (["ls"], ["du"]):
        assert run(emulator, *argv, f"gs://{bucket.bucket}/nothing/") == 3
        one_line_error(
            capsys.readouterr().err, "no objects match", f"gs://{bucket.bucket}/nothing/"
        )
    assert run(emulator, "cp", f"gs://{bucket.bucket}/nothing/", str(tmp_path / "o")) == 3
    one_line_error(capsys.readouterr().err, f"gs://{bucket.bucket}/nothing/")


def test_a_missing_object_is_not_found(
    emulator: Emulator, bucket: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(emulator, "cp", f"gs://{bucket.bucket}/model.pt", str(tmp_path / "m.pt")) == 3
    one_line_error(capsys.readouterr().err, f"gs://{bucket.bucket}/model.pt")


def test_permission_denied_exits_4(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.seed(bucket.bucket, {"data/a": b"x"})
    emulator.add_fault("list", "403", match="data/")
    assert run(emulator, "ls", f"gs://{bucket.bucket}/data/") == 4
    one_line_error(capsys.readouterr().err, f"gs://{bucket.bucket}/")


def test_cleanup_removes_leftovers_and_dry_run_removes_nothing(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    async def leave_leftovers() -> str:
        await bucket.put(f"{COMPOSED}a", b"1" * 100)
        await bucket.put(f"{COMPOSED}b", b"2" * 100)
        await bucket.put("data/keep", b"k")
        upload_id = await bucket.multipart_initiate("ckpt/epoch-3.pt")
        await bucket.multipart_upload_part("ckpt/epoch-3.pt", upload_id, 1, b"p" * 1000)
        return str(upload_id)

    upload_id = runtime.run(leave_leftovers())
    uri = f"gs://{bucket.bucket}/"

    assert run(emulator, "cleanup", "--dry-run", uri) == 0
    out = capsys.readouterr().out
    assert f"would remove composed object {uri}{COMPOSED}a" in out
    assert f"would abort incomplete upload to {uri}ckpt/epoch-3.pt (upload id {upload_id}" in out
    assert emulator.object_names(bucket.bucket, COMPOSED) == [f"{COMPOSED}a", f"{COMPOSED}b"]
    assert len(runtime.run(bucket.multipart_list())) == 1

    assert run(emulator, "cleanup", uri) == 0
    assert "removed 2 composed objects and aborted 1 incomplete upload" in capsys.readouterr().out
    assert emulator.object_names(bucket.bucket) == ["data/keep"]
    assert runtime.run(bucket.multipart_list()) == []


def test_bench_prints_a_table_and_deletes_what_it_wrote(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.seed(bucket.bucket, {"scratch/mine": b"x"})
    argv = ["bench", "--small-count", "30", "--small-size", "2KiB", "--large-size", "9MiB"]
    assert run(emulator, *argv, f"gs://{bucket.bucket}/scratch/") == 0
    table = capsys.readouterr().out.splitlines()
    assert [row.split()[0] for row in table[9:]] == ["requests:", "cost:"]
    assert [row.split()[:3] for row in table[3:9]] == [
        ["write", "small", "30"],
        ["write", "large", "1"],
        ["list", "31", "-"],
        ["read", "small", "30"],
        ["read", "large", "1"],
        ["delete", "31", "-"],
    ]
    assert emulator.object_names(bucket.bucket) == ["scratch/mine"]
    assert runtime.run(bucket.multipart_list()) == []


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchbucket", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_the_module_runs_as_a_program(emulator: Emulator, bucket: Any) -> None:
    emulator.seed(bucket.bucket, {"a/1": b"12345", "a/2": b"1"})
    # The endpoint from the environment, as the Google client libraries take it.
    done = _cli(
        "ls", "-l", f"gs://{bucket.bucket}/a/", env={"STORAGE_EMULATOR_HOST": emulator.endpoint}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"           5  gs://{bucket.bucket}/a/1",
        f"           1  gs://{bucket.bucket}/a/2",
        "TOTAL: 2 objects, 6 bytes (6 B)",
    ]

    done = _cli("--endpoint", emulator.endpoint, "ls", f"gs://no-such-{uuid.uuid4().hex[:8]}/")
    assert done.returncode == 3
    one_line_error(done.stderr, "gs://no-such-")

    done = _cli("ls", "gs://Not_A_Bucket/")
    assert done.returncode == 2
    one_line_error(done.stderr, "gs://Not_A_Bucket/")

    done = _cli("emulator", "--help")
    assert done.returncode == 0
    assert "--latency" in done.stdout


def test_a_failing_download_exits_1_and_leaves_no_partial_file(
    emulator: Emulator, bucket: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.seed(bucket.bucket, {f"d/{i:03d}": os.urandom(2000) for i in range(50)})
    emulator.add_fault("get", "503", match="d/007", count=None)
    dst = tmp_path / "dst"
    assert (
        main(
            [
                "--endpoint",
                emulator.endpoint,
                "--deadline",
                "1",
                "cp",
                f"gs://{bucket.bucket}/d/",
                str(dst),
            ]
        )
        == 1
    )
    one_line_error(capsys.readouterr().err, f"gs://{bucket.bucket}/d/007")
    assert not (dst / "007").exists()
    assert not list(dst.rglob("*.tbpart-*"))
