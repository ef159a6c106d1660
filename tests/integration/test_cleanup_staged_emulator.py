"""`torchbucket cleanup` removes the staged checkpoint objects a killed save left, over HTTP.

A multipart save on GCS completes under ``dir/.name.tbtmp-<16 hex>`` and deletes
that after copying it onto the checkpoint; a process killed in between leaves
it, hidden from listings and billed. Cleanup takes exactly such names, spares
ones younger than ``--older-than`` (a save may still be running), and reports
what it found like the other leftovers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.checkpoint.staged_names import staging_key
from torchbucket.cli import main
from torchbucket.cli._common import human_bytes
from torchbucket.compose.registry import in_flight, unregister
from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

#: Look like staging names but are not what a save makes: users' objects.
LOOKALIKES = [
    "run/.last.pt.tbtmp",  # no id
    "run/last.pt.tbtmp-0123456789abcdef",  # not a dot-name
    "run/.last.pt.tbtmp-abc",  # id too short
    "run/.last.pt.tbtmp-0123456789abcdef0",  # id too long
    "run/.last.pt.tbtmp-0123456789ABCDEF",  # not the lowercase hex a save writes
    "run/name.tbtmp-abc",
]


def run(emulator: Emulator, *argv: str) -> int:
    return main(["--endpoint", emulator.endpoint, "--deadline", "20", *argv])


@pytest.fixture
def bucket(emulator: Emulator, gcs_bucket_factory: Callable[..., Any]) -> Any:
    return gcs_bucket_factory(emulator, prefix="staged")


def test_an_old_staged_object_is_removed_a_young_one_and_lookalikes_are_kept(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    staged = staging_key("run/last.pt")
    nested = staging_key("run/deep/epoch-3.pt")

    async def leave() -> None:
        await bucket.put("run/last.pt", b"c" * 10)
        await bucket.put(staged, b"s" * 1000)
        await bucket.put(nested, b"n" * 24)
        for name in LOOKALIKES:
            await bucket.put(name, b"u")

    runtime.run(leave())
    written = time.time()
    everything = sorted(["run/last.pt", staged, nested, *LOOKALIKES])
    uri = f"gs://{bucket.bucket}/"

    # Just written: a save may still own them.
    assert run(emulator, "cleanup", "--older-than", "1h", uri) == 0
    assert capsys.readouterr().out.strip() == f"nothing to clean up in {uri}"
    assert emulator.object_names(bucket.bucket) == everything

    # Once they are over a second old (by the server's timeCreated), --older-than 1s takes them.
    time.sleep(max(0.0, written + 1.5 - time.time()))
    assert run(emulator, "cleanup", "--dry-run", "--older-than", "1s", uri) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(
        f"would remove staged checkpoint object {uri}{staged} (1000 B, created "
    )
    assert lines[1].startswith(
        f"would remove staged checkpoint object {uri}{nested} (24 B, created "
    )
    assert lines[-1] == (
        "dry run: 0 composed objects, 2 staged checkpoint objects (1 KiB) and 0 incomplete "
        f"uploads would be removed from {uri}"
    )
    assert len(lines) == 3, out
    assert emulator.object_names(bucket.bucket) == everything  # a dry run

    assert run(emulator, "cleanup", "--older-than", "1s", uri) == 0
    out = capsys.readouterr().out
    assert f"removing staged checkpoint object {uri}{staged} (1000 B, created " in out
    assert out.splitlines()[-1] == (
        "removed 0 composed objects, 2 staged checkpoint objects (1 KiB) and aborted 0 "
        f"incomplete uploads in {uri}"
    )
    assert emulator.object_names(bucket.bucket) == sorted(["run/last.pt", *LOOKALIKES])

    assert run(emulator, "cleanup", uri) == 0
    assert capsys.readouterr().out.strip() == f"nothing to clean up in {uri}"
    assert emulator.object_names(bucket.bucket) == sorted(["run/last.pt", *LOOKALIKES])


def test_only_staged_objects_under_the_prefix_are_taken(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    mine, other = staging_key("run/a.pt"), staging_key("other/b.pt")

    async def leave() -> None:
        await bucket.put(mine, b"m" * 5)
        await bucket.put(other, b"o" * 7)

    runtime.run(leave())
    uri = f"gs://{bucket.bucket}/run/"
    assert run(emulator, "cleanup", uri) == 0
    out = capsys.readouterr().out
    assert f"removing staged checkpoint object gs://{bucket.bucket}/{mine} (5 B)" in out
    assert other not in out
    assert "1 staged checkpoint object (5 B)" in out.splitlines()[-1]
    assert emulator.object_names(bucket.bucket) == [other]


def test_the_staged_object_a_save_leaves_is_removed(
    emulator: Emulator, bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The save's own staged object: here its delete is refused, as a kill would skip it."""
    uri = f"gs://{bucket.bucket}/run/last.pt"
    checkpoint = BucketCheckpoint(
        config=CheckpointConfig(part_size=64 * 1024, min_part_size=1, upload_method="multipart"),
        gcs=bucket.config,
    )
    emulator.add_fault("delete", "403", match=".tbtmp-", count=None)
    checkpoint.save({"w": torch.zeros(200, 200)}, uri)  # 160 KB: three parts
    emulator.clear_faults()
    left = [n for n in emulator.object_names(bucket.bucket) if n != "run/last.pt"]
    assert len(left) == 1 and left[0].startswith("run/.last.pt.tbtmp-"), left
    # This process would still delete it at exit; a killed one does not.
    assert bucket.uri(left[0]) in in_flight()
    unregister(bucket, left[0])
    size = human_bytes(runtime.run(bucket.head(left[0])).size)

    assert run(emulator, "cleanup", f"gs://{bucket.bucket}/") == 0
    out = capsys.readouterr().out
    assert f"removing staged checkpoint object gs://{bucket.bucket}/{left[0]} ({size})" in out
    assert f"1 staged checkpoint object ({size})" in out.splitlines()[-1]
    assert emulator.object_names(bucket.bucket) == ["run/last.pt"]
    with checkpoint.reader(uri) as f:
        assert torch.equal(torch.load(f, weights_only=True)["w"], torch.zeros(200, 200))
