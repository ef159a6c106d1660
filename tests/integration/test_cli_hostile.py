"""``cp`` and ``pack`` against hostile names, special files and symlinks, on the emulator.

Names that climb out of a folder, two objects for one local path, FIFOs,
devices, broken and looping symlinks, a symlink in the destination leading
outside it, and local errors (no space, name too long): each is refused or
skipped as ``cp --help`` says, and every error names the object.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from torchbucket.cli import _cp_local, main
from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator


@pytest.fixture
def bucket(emulator: Emulator, gcs_bucket_factory: Callable[..., Any]) -> str:
    return str(gcs_bucket_factory(emulator, prefix="hostile").bucket)


def run(emulator: Emulator, *argv: str) -> int:
    return main(["--endpoint", emulator.endpoint, "--deadline", "20", *argv])


def one_line_error(err: str, *needles: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("torchbucket: error: ")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], err
    return lines[0]


def tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def cli(emulator: Emulator, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The command line in its own process: a hang fails the test instead of the suite."""
    return subprocess.run(
        [sys.executable, "-m", "torchbucket", "--endpoint", emulator.endpoint, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- pack ---------------------------------------------------------------------


def test_pack_refuses_names_that_would_escape_a_tar_extractor(
    emulator: Emulator, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.seed(
        bucket, {"pk/ok.txt": b"ok", "pk/../../outside/pwn.txt": b"pwn", "pk//abs.txt": b"abs"}
    )

    assert run(emulator, "pack", f"gs://{bucket}/pk/", f"gs://{bucket}/packed/") == 2

    one_line_error(capsys.readouterr().err, f"gs://{bucket}/pk/", "nothing was packed")
    assert emulator.object_names(bucket, "packed/") == []


# --- cp downloads ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "path"),
    [
        (["coll/a//b", "coll/a/b"], "a/b"),  # two objects, one file
        (["coll/a", "coll/a/b"], "a"),  # a file where a folder must be
    ],
)
def test_two_objects_for_one_local_path_are_refused_before_anything_is_written(
    emulator: Emulator,
    bucket: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    names: list[str],
    path: str,
) -> None:
    emulator.seed(bucket, {"coll/first.txt": b"1", **{n: n.encode() for n in names}})
    dst = tmp_path / "dst"

    assert run(emulator, "cp", f"gs://{bucket}/coll/", str(dst)) == 1

    uris = [f"gs://{bucket}/{n}" for n in names]
    line = one_line_error(capsys.readouterr().err, str(dst / path), "nothing was copied")
    for uri in uris:  # both objects named, each whole
        assert re.search(re.escape(uri) + r"[ ,;]", line), line
    assert not dst.exists()


def test_names_that_climb_out_of_the_destination_are_refused(
    emulator: Emulator, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.seed(bucket, {"pk/ok.txt": b"ok", "pk/../../outside/pwn.txt": b"pwn"})
    dst = tmp_path / "a" / "b"

    assert run(emulator, "cp", f"gs://{bucket}/pk/", str(dst)) == 1

    one_line_error(capsys.readouterr().err, "../../outside/pwn.txt")
    assert tree(tmp_path) == []


def test_downloads_never_write_through_a_symlink_leading_outside(
    emulator: Emulator, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.seed(bucket, {"d/ok.txt": b"ok", "d/sub/pwn": b"pwn", "d/inner/x": b"x"})
    outside = tmp_path / "outside"
    outside.mkdir()
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "sub").symlink_to(outside)
    (dst / "real").mkdir()
    (dst / "inner").symlink_to(dst / "real")  # inside the destination: fine
    (dst / "ok.txt").symlink_to(outside / "ok.txt")  # replaced, never written through

    assert run(emulator, "cp", f"gs://{bucket}/d/", str(dst)) == 1

    one_line_error(capsys.readouterr().err, f"gs://{bucket}/d/sub/pwn", str(dst / "sub"))
    assert tree(outside) == []
    assert tree(dst) == ["inner", "ok.txt", "real", "sub"]

    (dst / "sub").unlink()
    assert run(emulator, "cp", f"gs://{bucket}/d/", str(dst)) == 0
    assert (dst / "real" / "x").read_bytes() == b"x"
    assert (dst / "sub" / "pwn").read_bytes() == b"pwn"
    assert not (dst / "ok.txt").is_symlink()
    assert (dst / "ok.txt").read_bytes() == b"ok"
    assert tree(outside) == []


def test_a_name_too_long_for_the_file_system_names_the_object(
    emulator: Emulator, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long_name = "long/" + "x" * 300 + ".bin"
    emulator.seed(bucket, {long_name: b"data"})

    assert run(emulator, "cp", f"gs://{bucket}/long/", str(tmp_path / "dst")) == 1

    one_line_error(
        capsys.readouterr().err, f"gs://{bucket}/{long_name}", "File name too long", "Errno 36"
    )


def test_no_space_left_names_the_object_and_leaves_no_partial_file(
    emulator: Emulator,
    bucket: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    emulator.seed(bucket, {"ckpt/model.pt": b"w" * 1000})

    class Full:
        def __init__(self, path: str, mode: str) -> None:
            self.file = open(path, mode)  # noqa: SIM115 - closed in __exit__

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.close()

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_cp_local, "open", Full, raising=False)
    dst = tmp_path / "dst"

    assert run(emulator, "cp", f"gs://{bucket}/ckpt/", str(dst)) == 1

    one_line_error(
        capsys.readouterr().err,
        f"gs://{bucket}/ckpt/model.pt",
        str(dst / "model.pt"),
        "No space left on device",
    )
    assert tree(dst) == []


def test_a_missing_object_is_named_as_typed(
    emulator: Emulator, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(emulator, "cp", f"gs://{bucket}/nope.pt", str(tmp_path)) == 3

    line = one_line_error(
        capsys.readouterr().err,
        f"no object gs://{bucket}/nope.pt and no objects under gs://{bucket}/nope.pt/",
    )
    assert "match" not in line


# --- cp uploads -----------------------------------------------------------------


@pytest.fixture
def awkward(tmp_path: Path) -> Path:
    """A folder with a FIFO, a socket, a symlink to /dev/zero, broken and folder symlinks."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"a")
    (src / "sub" / "b.txt").write_bytes(b"b")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "c.txt").write_bytes(b"c")
    os.mkfifo(src / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(src / "sock"))
    sock.close()
    (src / "zero").symlink_to("/dev/zero")
    (src / "broken").symlink_to(tmp_path / "missing")
    (src / "linked.txt").symlink_to(src / "a.txt")
    (src / "linkdir").symlink_to(tmp_path / "elsewhere")
    (src / "sub" / "loop").symlink_to(src)
    return src


def test_uploads_skip_special_files_and_follow_the_default_symlink_policy(
    emulator: Emulator, bucket: str, awkward: Path
) -> None:
    done = cli(emulator, "cp", str(awkward), f"gs://{bucket}/up/")

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("copied 3 objects")
    assert emulator.object_names(bucket, "up/") == ["up/a.txt", "up/linked.txt", "up/sub/b.txt"]
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line]
    for name, why in [
        ("fifo", "a FIFO"),
        ("sock", "a socket"),
        ("zero", "a character device"),
        ("broken", "a broken symlink"),
        ("linkdir", "a symlink to a folder"),
        ("sub/loop", "a symlink to a folder"),
    ]:
        assert [w for w in warnings if str(awkward / name) + ":" in w and why in w], done.stderr
    assert len(warnings) == 6, done.stderr


def test_follow_symlinks_copies_linked_folders_once_and_ignore_symlinks_none(
    emulator: Emulator, bucket: str, awkward: Path
) -> None:
    done = cli(emulator, "cp", "--follow-symlinks", str(awkward), f"gs://{bucket}/f/")
    assert done.returncode == 0, done.stderr
    assert emulator.object_names(bucket, "f/") == [
        "f/a.txt",
        "f/linkdir/c.txt",
        "f/linked.txt",
        "f/sub/b.txt",
    ]
    assert "symlink loop" in done.stderr

    done = cli(emulator, "cp", "--ignore-symlinks", str(awkward), f"gs://{bucket}/i/")
    assert done.returncode == 0, done.stderr
    assert emulator.object_names(bucket, "i/") == ["i/a.txt", "i/sub/b.txt"]


def test_strict_refuses_special_files_before_uploading_anything(
    emulator: Emulator, bucket: str, awkward: Path
) -> None:
    done = cli(emulator, "cp", "--strict", str(awkward), f"gs://{bucket}/s/")

    assert done.returncode == 1
    one_line_error(done.stderr, "--strict", "nothing copied")
    assert emulator.object_names(bucket, "s/") == []


def test_a_special_file_named_alone_is_refused(
    emulator: Emulator, bucket: str, awkward: Path
) -> None:
    done = cli(emulator, "cp", str(awkward / "zero"), f"gs://{bucket}/z")

    assert done.returncode == 1
    one_line_error(done.stderr, str(awkward / "zero"), "a character device")


def _sigint_at_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_an_upload_with_exit_130(
    emulator: Emulator, bucket: str, awkward: Path
) -> None:
    emulator.add_fault("put", "stall", stall_seconds=60)
    argv = ["--endpoint", emulator.endpoint, "cp", str(awkward), f"gs://{bucket}/ctrlc/"]
    child = subprocess.Popen(
        [sys.executable, "-m", "torchbucket", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As a terminal's foreground job has it: a suite started in the
        # background by a shell without job control (`make test &`, nohup)
        # hands its children SIGINT ignored, and Python keeps an ignored
        # SIGINT ignored, so the child would sit out the stall.
        preexec_fn=_sigint_at_default,
    )
    try:
        for _ in range(600):  # until the upload is held by the emulator
            if any(rule["fired"] for rule in emulator.faults()):
                break
            assert child.poll() is None, child.communicate()
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
    finally:
        child.kill()
        emulator.clear_faults()

    assert child.returncode == 130, err
    assert "interrupted" in err
