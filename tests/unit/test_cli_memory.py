"""The command line over the in-process memory store: output, exit codes, errors."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from memory_helper import memory_bucket

from torchbucket import runtime
from torchbucket.cli import build_parser, main
from torchbucket.cli._cleanup import parse_duration
from torchbucket.cli._common import human_bytes, parse_size
from torchbucket.storage import MemoryStore

COMMANDS = ["ls", "du", "cp", "cleanup", "bench", "demo"]


@pytest.fixture
def bucket() -> Iterator[MemoryStore]:
    with memory_bucket("cli") as name:
        yield MemoryStore(name)


def put(store: MemoryStore, key: str, data: bytes) -> None:
    runtime.run(store.put(key, data))


def assert_one_line_error(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("torchbucket: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], err


def test_ls_prints_every_object_uri_in_order(
    bucket: MemoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in ["data/b.png", "data/a.png", "data/sub/c.png", "other/x"]:
        put(bucket, key, b"123")
    assert main(["ls", f"memory://{bucket.bucket}/data/"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"memory://{bucket.bucket}/data/a.png",
        f"memory://{bucket.bucket}/data/b.png",
        f"memory://{bucket.bucket}/data/sub/c.png",
    ]


def test_ls_long_shows_sizes_and_a_total(
    bucket: MemoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    put(bucket, "d/one", b"x" * 10)
    put(bucket, "d/two", b"x" * 2048)
    assert main(["ls", "-l", f"memory://{bucket.bucket}/d/"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["10", f"memory://{bucket.bucket}/d/one"]
    assert lines[1].split() == ["2048", f"memory://{bucket.bucket}/d/two"]
    assert lines[2] == "TOTAL: 2 objects, 2058 bytes (2.01 KiB)"


def test_ls_hides_composed_objects(bucket: MemoryStore, capsys: pytest.CaptureFixture[str]) -> None:
    put(bucket, "dataflux-composed-objects/leftover", b"x")
    put(bucket, "real", b"x")
    assert main(["ls", f"memory://{bucket.bucket}/"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"memory://{bucket.bucket}/real"]


def test_ls_of_an_empty_prefix_is_not_found(
    bucket: MemoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    put(bucket, "data/a", b"x")
    assert main(["ls", f"memory://{bucket.bucket}/nothing/"]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_one_line_error(captured.err, "no objects match", f"memory://{bucket.bucket}/nothing/")
    assert main(["ls", f"memory://{bucket.bucket}/data/*"]) == 3
    assert_one_line_error(capsys.readouterr().err, "wildcards are not expanded")


@pytest.mark.parametrize(
    ("uri", "needle"),
    [
        ("gs://Bad_Bucket/x", "not a valid GCS bucket name"),
        ("s3://bucket/x", "unsupported scheme"),
        ("just-a-path", "is not a URI"),
        ("gs:///key", "names no bucket"),
    ],
)
@pytest.mark.parametrize("command", ["ls", "du", "cleanup", "bench"])
def test_malformed_uri_is_a_usage_error(
    command: str, uri: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, uri]) == 2
    assert_one_line_error(capsys.readouterr().err, needle, uri)


def test_du_counts_per_folder_and_in_total(
    bucket: MemoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    put(bucket, "ds/train/a", b"x" * 100)
    put(bucket, "ds/train/b", b"x" * 100)
    put(bucket, "ds/val/a", b"x" * 50)
    put(bucket, "ds/README", b"x" * 7)
    assert main(["du", f"memory://{bucket.bucket}/ds/"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [(r[0], r[2], r[-1]) for r in rows] == [
        ("2", "200", f"memory://{bucket.bucket}/ds/train/"),
        ("1", "50", f"memory://{bucket.bucket}/ds/val/"),
        ("4", "257", f"memory://{bucket.bucket}/ds/"),
    ]
    assert main(["du", "-s", f"memory://{bucket.bucket}/ds/"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_du_of_an_empty_prefix_is_not_found(
    bucket: MemoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["du", f"memory://{bucket.bucket}/none/"]) == 3
    assert_one_line_error(capsys.readouterr().err, "no objects match")


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_cp_round_trip_preserves_names_and_bytes(
    bucket: MemoryStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    files = {
        "a.bin": os.urandom(1000),
        "sub/b.bin": os.urandom(5),
        "sub/deeper/c": b"",
        "big": os.urandom(3 << 20),
    }
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    uri = f"memory://{bucket.bucket}/up/"
    # A low threshold sends the big file through the streaming paths both ways.
    assert main(["cp", "--stream-threshold", "1MiB", str(src), uri]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"copied 4 objects, {sum(map(len, files.values()))} bytes")
    assert line.endswith("MB/s")
    assert {k: runtime.run(bucket.get("up/" + k)) for k in files} == files

    dst = tmp_path / "dst"
    assert main(["cp", "--stream-threshold", "1MiB", uri, str(dst)]) == 0
    assert _tree(dst) == files
    assert not [p for p in dst.rglob("*.tbpart-*")]


def test_cp_single_object_to_a_file_and_to_a_folder(
    bucket: MemoryStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    put(bucket, "m/model.pt", b"weights")
    put(bucket, "m/model.pt.bak", b"other")
    assert main(["cp", f"memory://{bucket.bucket}/m/model.pt", str(tmp_path / "renamed.pt")]) == 0
    assert (tmp_path / "renamed.pt").read_bytes() == b"weights"
    assert main(["cp", f"memory://{bucket.bucket}/m/model.pt", str(tmp_path)]) == 0
    assert (tmp_path / "model.pt").read_bytes() == b"weights"
    assert main(["cp", str(tmp_path / "model.pt"), f"memory://{bucket.bucket}/copy/"]) == 0
    assert runtime.run(bucket.get("copy/model.pt")) == b"weights"
    assert "copied 1 object," in capsys.readouterr().out


def test_cp_of_a_missing_local_path_is_not_found(
    bucket: MemoryStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing"
    assert main(["cp", str(missing), f"memory://{bucket.bucket}/x/"]) == 3
    assert_one_line_error(capsys.readouterr().err, str(missing))


def test_cp_of_an_empty_prefix_is_not_found(
    bucket: MemoryStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cp", f"memory://{bucket.bucket}/nothing/", str(tmp_path / "out")]) == 3
    assert_one_line_error(capsys.readouterr().err, f"memory://{bucket.bucket}/nothing/")
    assert not (tmp_path / "out").exists()


def test_cp_refuses_names_that_escape_the_destination(
    bucket: MemoryStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    put(bucket, "p/../../escaped", b"x")
    assert main(["cp", f"memory://{bucket.bucket}/p/", str(tmp_path / "out")]) == 1
    assert_one_line_error(capsys.readouterr().err, "refusing")
    assert not (tmp_path / "escaped").exists()


def test_bench_prints_a_table_and_leaves_nothing(
    bucket: MemoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    put(bucket, "keep", b"x")
    argv = ["bench", "--small-count", "20", "--small-size", "1KiB", "--large-size", "20MiB"]
    assert main([*argv, f"memory://{bucket.bucket}/scratch/"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    steps = [line.split()[0] for line in lines[3:9]]
    assert steps == ["write", "write", "list", "read", "read", "delete"]
    # After the table: what the run cost, in requests and at list prices.
    assert [line.split()[0] for line in lines[9:]] == ["requests:", "cost:"]
    names = [o.name for o in runtime.run(bucket.list_page("")).objects]
    assert names == ["keep"]
    assert runtime.run(bucket.multipart_list()) == []


def test_cleanup_dry_run_lists_and_removes_nothing(
    bucket: MemoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    put(bucket, "dataflux-composed-objects/c1", b"x" * 10)
    upload_id = runtime.run(bucket.multipart_initiate("ckpt/epoch1.pt"))
    runtime.run(bucket.multipart_initiate("elsewhere/other.pt"))
    assert main(["cleanup", "--dry-run", f"memory://{bucket.bucket}/ckpt/"]) == 0
    out = capsys.readouterr().out
    assert (
        f"would remove composed object memory://{bucket.bucket}/dataflux-composed-objects/c1" in out
    )
    assert f"would abort incomplete upload to memory://{bucket.bucket}/ckpt/epoch1.pt" in out
    assert upload_id in out
    assert "other.pt" not in out
    assert out.splitlines()[-1].startswith("dry run: 1 composed object and 1 incomplete upload")
    assert len(runtime.run(bucket.multipart_list())) == 2
    assert runtime.run(bucket.head("dataflux-composed-objects/c1")).size == 10


def test_cleanup_removes_composites_and_uploads_under_the_prefix(
    bucket: MemoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    put(bucket, "dataflux-composed-objects/c1", b"x")
    put(bucket, "dataflux-composed-objects/c2", b"x")
    put(bucket, "data/keep", b"x")
    runtime.run(bucket.multipart_initiate("ckpt/epoch1.pt"))
    runtime.run(bucket.multipart_initiate("elsewhere/other.pt"))
    assert main(["cleanup", f"memory://{bucket.bucket}/ckpt/"]) == 0
    assert "removed 2 composed objects and aborted 1 incomplete upload" in capsys.readouterr().out
    names = [o.name for o in runtime.run(bucket.list_page("")).objects]
    assert names == ["data/keep"]
    assert [u.key for u in runtime.run(bucket.multipart_list())] == ["elsewhere/other.pt"]
    assert main(["cleanup", f"memory://{bucket.bucket}/"]) == 0
    assert runtime.run(bucket.multipart_list()) == []
    assert main(["cleanup", f"memory://{bucket.bucket}/"]) == 0
    assert "nothing to clean up" in capsys.readouterr().out


def test_cleanup_older_than_spares_recent_uploads(
    bucket: MemoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime.run(bucket.multipart_initiate("ckpt/now.pt"))
    assert main(["cleanup", "--older-than", "1h", f"memory://{bucket.bucket}/"]) == 0
    assert "nothing to clean up" in capsys.readouterr().out
    assert len(runtime.run(bucket.multipart_list())) == 1


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_exit_codes(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: torchbucket {command}")
    assert "3    not found" in out


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["frobnicate"]) == 2
    assert main(["cp", "only-one"]) == 2
    assert main(["cp", "-j", "0", "a", "b"]) == 2
    assert main(["bench", "--small-size", "lots", "memory://x/"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_global_options_work_before_and_after_the_command() -> None:
    parser = build_parser()
    before = parser.parse_args(["--endpoint", "http://h:1", "-v", "ls", "gs://bkt/"])
    after = parser.parse_args(["ls", "--endpoint", "http://h:1", "-v", "gs://bkt/"])
    for args in (before, after):
        assert isinstance(args, argparse.Namespace)
        assert (args.endpoint, args.verbose, args.uri) == ("http://h:1", 1, "gs://bkt/")


@given(
    st.integers(min_value=0, max_value=1 << 50),
    st.sampled_from(["", "K", "KiB", "M", "MiB", "G", "GB"]),
)
def test_parse_size_scales_by_powers_of_1024(number: int, unit: str) -> None:
    power = {"": 0, "K": 1, "KiB": 1, "M": 2, "MiB": 2, "G": 3, "GB": 3}[unit]
    assert parse_size(f"{number}{unit}") == number * 1024**power


def test_parse_size_and_duration_reject_nonsense() -> None:
    for bad in ["", "-1", "1X", "MiB", "1.2.3K"]:
        with pytest.raises(argparse.ArgumentTypeError):
            parse_size(bad)
    assert parse_duration("90") == 90
    assert parse_duration("10m") == 600
    assert parse_duration("2h") == 7200
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration("soon")


@given(st.integers(min_value=0, max_value=1 << 60))
@example(1048051712)  # 999.5 MiB: "%.3g" wrote "1e+03 MiB"
@example((1 << 20) - 1)
def test_human_bytes_is_short_and_in_range(size: int) -> None:
    text = human_bytes(size)
    number, unit = text.split()
    assert len(number) <= 4
    factor = 1024 ** ["B", "KiB", "MiB", "GiB", "TiB", "PiB"].index(unit)
    assert abs(float(number) * factor - size) <= max(0.01 * size, 1)


def test_human_bytes_writes_what_rounds_to_a_thousand_whole() -> None:
    assert human_bytes(1048051712) == "1000 MiB"
    assert human_bytes(999 * 1024) == "999 KiB"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(1023) == "1023 B"
