"""GCSStore through the emulator's fault injection: every operation rides out a
fault that another attempt cures, and the bytes and the bucket end up right."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from torchbucket import runtime
from torchbucket.errors import DeadlineExceededError, PreconditionFailedError, ThrottledError
from torchbucket.storage.base import ObjectInfo

pytestmark = pytest.mark.emulator

DATA = bytes(range(256)) * 40  # 10 KiB
BIG = bytes(range(251)) * 2200  # ~540 KiB: three resumable chunks of 256 KiB


def _names(store: Any, prefix: str = "") -> list[str]:
    return [o.name for o in runtime.run(store.list_page(prefix)).objects]


async def _chunks(data: bytes, size: int = 100_000) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _get(store: Any) -> None:
    runtime.run(store.put("obj", DATA))
    assert runtime.run(store.get("obj")) == DATA
    buffer = bytearray(len(DATA))
    assert runtime.run(store.get_into("obj", memoryview(buffer))) == len(DATA)
    assert buffer == DATA


def _get_range(store: Any) -> None:
    runtime.run(store.put("obj", DATA))
    assert runtime.run(store.get("obj", start=100, end=5000)) == DATA[100:5000]


def _stream(store: Any) -> None:
    runtime.run(store.put("obj", DATA))

    async def collect() -> bytes:
        return b"".join([c async for c in store.stream("obj", chunk_size=1000)])

    assert runtime.run(collect()) == DATA


def _head(store: Any) -> None:
    info = runtime.run(store.put("obj", DATA))
    assert runtime.run(store.head("obj")) == info


def _list(store: Any) -> None:
    for i in range(3):
        runtime.run(store.put(f"p/{i}", b"x"))
    assert _names(store, "p/") == ["p/0", "p/1", "p/2"]


def _put(store: Any) -> None:
    info = runtime.run(store.put("obj", DATA, if_generation_match=0))
    assert info.size == len(DATA)
    assert runtime.run(store.get("obj")) == DATA
    assert _names(store) == ["obj"]


def _resumable(store: Any) -> None:
    info = runtime.run(store.put_stream("obj", _chunks(BIG)))
    assert info.size == len(BIG)
    assert runtime.run(store.get("obj")) == BIG
    assert _names(store) == ["obj"]


def _compose(store: Any) -> None:
    a = runtime.run(store.put("a", b"left-"))
    b = runtime.run(store.put("b", b"right"))
    runtime.run(store.compose("ab", [a, b], if_generation_match=0))
    assert runtime.run(store.get("ab")) == b"left-right"
    assert _names(store) == ["a", "ab", "b"]


def _delete(store: Any) -> None:
    info = runtime.run(store.put("obj", DATA))
    runtime.run(store.put("keep", b"k"))
    runtime.run(store.delete("obj", generation=info.generation))
    assert _names(store) == ["keep"]


def _copy(store: Any) -> None:
    runtime.run(store.put("src", DATA))
    runtime.run(store.copy("src", "dst"))
    assert runtime.run(store.get("dst")) == DATA
    assert _names(store) == ["dst", "src"]


def _multipart(store: Any) -> None:
    upload_id = runtime.run(store.multipart_initiate("ckpt"))
    parts = [
        runtime.run(store.multipart_upload_part("ckpt", upload_id, n, bytes([n]) * 3000))
        for n in (1, 2, 3)
    ]
    assert [u.upload_id for u in runtime.run(store.multipart_list())] == [upload_id]
    info = runtime.run(store.multipart_complete("ckpt", upload_id, parts))
    assert info.size == 9000
    assert runtime.run(store.get("ckpt")) == b"\x01" * 3000 + b"\x02" * 3000 + b"\x03" * 3000
    assert runtime.run(store.multipart_list()) == []
    assert _names(store) == ["ckpt"]


def _multipart_abort(store: Any) -> None:
    upload_id = runtime.run(store.multipart_initiate("ckpt"))
    runtime.run(store.multipart_upload_part("ckpt", upload_id, 1, b"x" * 100))
    runtime.run(store.multipart_abort("ckpt", upload_id))
    assert runtime.run(store.multipart_list()) == []
    assert _names(store) == []


Scenario = Callable[[Any], None]
CASES: list[tuple[str, Scenario, tuple[str, ...]]] = [
    ("get", _get, ("503", "429", "reset", "truncate", "corrupt", "stall")),
    ("get", _get_range, ("503", "reset", "truncate")),
    ("get", _stream, ("503", "reset", "truncate")),
    ("head", _head, ("503", "reset", "stall")),
    ("list", _list, ("429", "503", "reset", "truncate")),
    ("put", _put, ("503", "reset", "truncate")),
    ("resumable", _resumable, ("503", "reset")),
    ("compose", _compose, ("503", "reset", "truncate")),
    ("delete", _delete, ("503", "reset")),
    ("copy", _copy, ("503", "reset")),
    ("mpu_initiate", _multipart, ("503", "reset")),
    ("mpu_part", _multipart, ("503", "reset")),
    ("mpu_complete", _multipart, ("503", "reset", "truncate")),
    ("mpu_list", _multipart, ("503", "reset")),
    ("mpu_abort", _multipart_abort, ("503", "reset")),
]


@pytest.mark.parametrize("server", ["emulator", "fake_gcs"])
@pytest.mark.parametrize(
    ("op", "scenario", "kind"),
    [
        pytest.param(op, scenario, kind, id=f"{op}-{scenario.__name__[1:]}-{kind}")
        for op, scenario, kinds in CASES
        for kind in kinds
    ],
)
def test_one_fault_is_ridden_out(
    request: pytest.FixtureRequest,
    gcs_bucket_factory: Any,
    server: str,
    op: str,
    scenario: Scenario,
    kind: str,
) -> None:
    emulator = request.getfixturevalue(server)
    store = gcs_bucket_factory(emulator, prefix="fault")
    rule = emulator.add_fault(op, kind, stall_seconds=1.0)
    scenario(store)
    fired = {r["id"]: r["fired"] for r in emulator.faults()}
    assert fired[rule] == 1, "the fault never reached the store"


def test_an_endless_throttle_ends_at_the_deadline(emulator: Any, gcs_bucket_factory: Any) -> None:
    from torchbucket.config import RetryConfig

    retry = RetryConfig(initial_backoff=0.01, max_backoff=0.02, deadline=0.5)
    store = gcs_bucket_factory(emulator, prefix="fault", retry=retry)
    runtime.run(store.put("obj", b"x"))
    emulator.add_fault("get", "429", count=None)
    with pytest.raises(DeadlineExceededError) as info:
        runtime.run(store.get("obj"))
    assert isinstance(info.value.__cause__, ThrottledError)
    assert store.uri("obj") in str(info.value)


def test_a_write_without_precondition_is_repeated_pinned_to_what_it_saw(
    emulator: Any, gcs_bucket_factory: Any
) -> None:
    store = gcs_bucket_factory(emulator, prefix="fault")
    runtime.run(store.put("obj", b"old"))
    emulator.reset_stats()
    emulator.add_fault("put", "503")
    info: ObjectInfo = runtime.run(store.put("obj", DATA))
    assert info.size == len(DATA)
    assert runtime.run(store.get("obj")) == DATA
    # The 503, one HEAD to see whether it took effect, one repeat.
    assert emulator.stats()["by_op"].get("put") == 2
    assert emulator.stats()["by_op"].get("head") == 1


@pytest.mark.parametrize("kind", ["truncate", "corrupt"])
def test_a_write_whose_answer_was_lost_is_recognised_not_repeated(
    emulator: Any, gcs_bucket_factory: Any, kind: str
) -> None:
    store = gcs_bucket_factory(emulator, prefix="fault")
    runtime.run(store.put("obj", b"old"))
    emulator.reset_stats()
    emulator.add_fault("put", kind)
    info: ObjectInfo = runtime.run(store.put("obj", DATA))
    assert info.size == len(DATA)
    assert runtime.run(store.get("obj")) == DATA
    assert emulator.stats()["by_op"].get("put") == 1


def test_a_repeat_does_not_overwrite_another_writers_object(
    emulator: Any, gcs_bucket_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repeat after a lost answer is pinned to the generation the HEAD saw."""
    store = gcs_bucket_factory(emulator, prefix="fault")
    runtime.run(store.put("obj", b"old"))
    emulator.add_fault("put", "503")
    from torchbucket.storage.gcs import _head

    original = _head.head_once

    async def head_then_someone_writes(transport: Any, key: str, operation: str) -> Any:
        info = await original(transport, key, operation)
        emulator.seed(store.bucket, {"obj": b"another writer"})
        return info

    monkeypatch.setattr(_head, "head_once", head_then_someone_writes)
    with pytest.raises(PreconditionFailedError):
        runtime.run(store.put("obj", DATA))
    assert runtime.run(store.get("obj")) == b"another writer"


_EXIT_SCRIPT = """
import multiprocessing, sys, warnings
warnings.simplefilter("always")
from torchbucket import runtime
from torchbucket.storage import store_for

store, key = store_for(sys.argv[1])
runtime.run(store.put(key, b"written by the parent"))

def child(q):
    q.put(runtime.run(store.get(key)))

if __name__ == "__main__":
    for method in ("fork", "spawn"):
        ctx = multiprocessing.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        assert q.get(timeout=60) == b"written by the parent", method
        p.join()
        assert p.exitcode == 0, (method, p.exitcode)
    assert runtime.run(store.get(key)) == b"written by the parent"
    print("ok")
"""


def test_forked_and_spawned_children_read_and_every_process_exits_cleanly(
    run_child_script: Callable[[str], Any],
) -> None:
    done = run_child_script(_EXIT_SCRIPT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert "Unclosed" not in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", ["503", "reset"])
def test_a_part_sent_in_slices_is_sent_whole_again_after_a_fault(
    emulator: Any, gcs_bucket_factory: Any, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    from torchbucket.storage.gcs import _multipart as _gcs_multipart

    # Parts of several slices, one of them not full, each from a writable view
    # as a checkpoint writer hands them over.
    monkeypatch.setattr(_gcs_multipart, "_SLICE", 1000)
    store = gcs_bucket_factory(emulator, prefix="fault")
    parts_data = [bytearray(bytes([n]) * 2500 + DATA[: 100 * n]) for n in (1, 2, 3)]
    rule = emulator.add_fault("mpu_part", kind, nth=2)
    upload_id = runtime.run(store.multipart_initiate("ckpt"))
    parts = [
        runtime.run(store.multipart_upload_part("ckpt", upload_id, n, memoryview(data)))
        for n, data in enumerate(parts_data, 1)
    ]
    info = runtime.run(store.multipart_complete("ckpt", upload_id, parts))
    whole = b"".join(parts_data)
    assert info.size == len(whole)
    assert runtime.run(store.get("ckpt")) == whole
    assert {r["id"]: r["fired"] for r in emulator.faults()}[rule] == 1


def test_a_completed_upload_is_known_from_the_completion_answer(
    emulator: Any, gcs_bucket_factory: Any
) -> None:
    store = gcs_bucket_factory(emulator, prefix="fault")
    upload_id = runtime.run(store.multipart_initiate("ckpt"))
    parts = [
        runtime.run(store.multipart_upload_part("ckpt", upload_id, n, bytes([n]) * (1000 * n)))
        for n in (1, 2, 3)
    ]
    emulator.reset_stats()
    info = runtime.run(store.multipart_complete("ckpt", upload_id, parts))
    # Its generation and CRC32C, vouched for by the parts' CRC32C: no metadata read.
    assert emulator.stats()["by_op"].get("head", 0) == 0
    head = runtime.run(store.head("ckpt"))
    assert (info.name, info.size, info.generation, info.crc32c) == (
        head.name,
        head.size,
        head.generation,
        head.crc32c,
    )
