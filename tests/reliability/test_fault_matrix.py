"""The fault matrix: every fault on every operation the product uses, through the proxy.

Each case injects one fault kind on one operation of the emulator's model store,
hit once, hit three times then recovering, or hit on every request until the
client's retry deadline (one second here) has passed, while a user workload runs:

- ``list``, ``get``, ``compose``, ``delete``: a dataset epoch of 50 tiny
  objects (compose on for ``compose`` and ``delete``, off for ``get`` so every
  object is a direct read). It yields every object once with its exact bytes,
  or raises a torchbucket error naming the URI it failed on. No composite is
  left: deleted by the epoch, or (when deletes fail past the deadline) by the
  process's registry, which the test runs as process exit would.
- ``put``, ``resumable``, ``mpu_initiate``, ``mpu_part``, ``mpu_complete``: a
  checkpoint save over an existing checkpoint (a simple upload when it fits one
  part; a resumable upload in 256 KiB chunks; 64 KiB multipart parts). It
  completes and loads identically, or raises a torchbucket error naming the
  checkpoint and the previous checkpoint still loads. No incomplete multipart
  upload and no composite is left.
- ``ranged_get``: a checkpoint load in 64 KiB ranges: identical, or an error
  naming the checkpoint.

The ``corrupt_request`` column damages the request's body on its way to the
store (one byte flipped) for the operations that upload: the store refuses
what does not match the checksum the client declared, so the previous
checkpoint always survives unchanged and nothing partial is visible; a refused
part or simple upload is sent again.

:data:`EXPECTED` says which outcome each case must have; the table in
docs/reliability.md is printed from it by running this file as a script.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Callable

import pytest
from _workloads import (
    GIVE_UP,
    RECOVER,
    STALL_SECONDS,
    Bucket,
    check_epoch,
    delete_registered_composites,
    epoch,
    same_state,
    state,
)

from torchbucket.compose.registry import in_flight
from torchbucket.emulator import Emulator
from torchbucket.errors import DeadlineExceededError, StorageError

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]

OPS = (
    "list",
    "get",
    "compose",
    "delete",
    "ranged_get",
    "put",
    "resumable",
    "mpu_initiate",
    "mpu_part",
    "mpu_complete",
)
KINDS = ("429", "503", "reset", "truncate", "corrupt", "stall", "corrupt_request")
MODES = ("once", "repeated", "past_deadline")

#: Faulted requests per mode (``None``: every one).
COUNT: dict[str, int | None] = {"once": 1, "repeated": 3, "past_deadline": None}

DATASET_OPS = ("list", "get", "compose", "delete")
#: The operations whose requests carry bytes (or the document that assembles
#: them): the only ones a damaged request body applies to.
UPLOAD_OPS = ("compose", "put", "resumable", "mpu_part", "mpu_complete")
CKPT_KEY = "run/ckpt.pt"


#: Where the product gives up by design: a workload whose own request fails
#: past the deadline raises. Compose and delete failures never fail an epoch
#: (direct reads; composites left to the registry). A corrupted body changes
#: nothing where the answer has none (a delete's 204, a part's empty 200) or
#: where its body is not needed (a completion is checked by a HEAD after it).
_SURVIVES_PAST_DEADLINE = {"compose", "delete"}
_BODY_UNUSED = {
    ("delete", "corrupt"),
    ("delete", "truncate"),  # a 204 has no body to cut short
    ("mpu_part", "corrupt"),
    ("mpu_complete", "corrupt"),
}

#: Writes that take effect although every answer is lost until the deadline:
#: the store (or, for a completion, the checkpoint writer) recognises them by
#: the object, which holds exactly what was sent (size and CRC32C), so the save
#: succeeds.
_RECOGNISED_PAST_DEADLINE = {
    ("put", "truncate"),
    ("put", "corrupt"),
    ("resumable", "corrupt"),
    ("mpu_complete", "truncate"),
}
#: A simple upload whose answer was lost is recognised by the HEAD that comes
#: before its repeat, so it is not repeated: the fault fires once.
_NOT_REPEATED = {("put", "truncate"), ("put", "corrupt")}

#: A damaged request that cannot be sent again: a resumable upload is checked
#: once, when it finalizes (the earlier chunks are gone by then; a damaged
#: session start is a malformed request), and a damaged completion document is
#: malformed (400, not retried). The save fails; the previous checkpoint stays.
#: A refused compose leaves the dataset to read the group directly.
_REFUSED_FOR_GOOD = {("resumable", "corrupt_request"), ("mpu_complete", "corrupt_request")}
#: The first request a fault hits, where not the first: a resumable save's
#: first request starts the session; its chunks are what carries the bytes.
FIRST_HIT = {("resumable", "corrupt_request"): 2}
#: Refused and not repeated: the fault fires once per request of its kind.
_NOT_RETRIED = _REFUSED_FOR_GOOD | {("compose", "corrupt_request")}


#: Known bugs, reported (see docs/reliability.md): the case is expected to fail
#: its checks until fixed. Strict: a fix makes the case pass and the marker go.
KNOWN_BUGS: dict[tuple[str, str], str] = {}
KNOWN_BUGS_AT: dict[tuple[str, str, str], str] = {}


def known_bug(op: str, kind: str, mode: str) -> str | None:
    """The reported bug this case meets, if any."""
    return KNOWN_BUGS_AT.get((op, kind, mode)) or KNOWN_BUGS.get((op, kind))


def expected(op: str, kind: str, mode: str) -> str:
    """``"ok"`` (the exact data) or ``"error"`` (a clear error, nothing damaged)."""
    if (op, kind) in _REFUSED_FOR_GOOD:
        return "error"
    if mode != "past_deadline":
        return "ok"
    if op in _SURVIVES_PAST_DEADLINE or (op, kind) in _BODY_UNUSED:
        return "ok"
    if (op, kind) in _RECOGNISED_PAST_DEADLINE:
        return "ok"
    return "error"


def run_dataset(bucket: Bucket, op: str, kind: str, mode: str) -> tuple[str, object]:
    want = bucket.seed_dataset()
    retry = GIVE_UP if mode == "past_deadline" else RECOVER
    emu = bucket.emu

    def fault() -> None:
        emu.add_fault(op, kind, count=COUNT[mode], stall_seconds=STALL_SECONDS)

    try:
        if op == "list":
            fault()
        ds = bucket.dataset(retry, compose=op != "get")
        if op != "list":
            fault()
        samples = epoch(ds)
    except StorageError as exc:
        outcome: tuple[str, object] = ("error", exc)
    else:
        check_epoch(samples, want)
        outcome = ("ok", samples)
    finally:
        check_fired(emu, op, kind, mode)
    return outcome


def check_fired(emu: Emulator, op: str, kind: str, mode: str) -> None:
    """The fault did hit (and, when repeated on a retried request, three times); clear it."""
    fired = sum(rule["fired"] for rule in emu.faults())
    emu.clear_faults()
    assert fired >= 1, "the fault never fired: the case tested nothing"
    if mode == "repeated" and (op, kind) not in _BODY_UNUSED | _NOT_REPEATED | _NOT_RETRIED:
        assert fired == 3


def run_checkpoint(bucket: Bucket, op: str, kind: str, mode: str) -> tuple[str, object]:
    retry = GIVE_UP if mode == "past_deadline" else RECOVER
    method = "resumable" if op == "resumable" else "multipart"
    uri = bucket.uri(CKPT_KEY)
    good = bucket.checkpoint()
    good.save(state(1), uri)
    # A save of one part is a simple upload; otherwise 64 KiB parts.
    extra = {"part_size": 4 << 20} if op == "put" else {}
    faulted = bucket.checkpoint(retry, method=method, **extra)
    emu = bucket.emu
    fault_op = "get" if op == "ranged_get" else op
    try:
        if op == "ranged_get":
            good.save(state(2), uri)
        emu.add_fault(
            fault_op,
            kind,
            nth=FIRST_HIT.get((op, kind)),
            count=COUNT[mode],
            stall_seconds=STALL_SECONDS,
            match=None,
        )
        if op == "ranged_get":
            got = faulted.load(uri, weights_only=True)
            assert same_state(got, state(2))
        else:
            faulted.save(state(2), uri)
    except StorageError as exc:
        outcome: tuple[str, object] = ("error", exc)
    else:
        outcome = ("ok", None)
    finally:
        check_fired(emu, op, kind, mode)
    survivor = good.load(uri, weights_only=True)
    survivor_is_new = same_state(survivor, state(2))
    if op != "ranged_get":
        assert survivor_is_new == (outcome[0] == "ok"), "a failed save changed the checkpoint"
        if outcome[0] == "error":
            assert same_state(survivor, state(1)), "a failed save lost the previous checkpoint"
    return outcome


def run_case(bucket: Bucket, op: str, kind: str, mode: str) -> tuple[str, object]:
    if op in DATASET_OPS:
        outcome = run_dataset(bucket, op, kind, mode)
        # Composites still in the bucket are those whose delete failed: each is
        # registered for deletion at exit, which is what deletes them here.
        registered = {u for u in in_flight() if u.startswith(bucket.uri())}
        assert {bucket.uri(name) for name in bucket.composites()} <= registered
        delete_registered_composites()
    else:
        outcome = run_checkpoint(bucket, op, kind, mode)
    return outcome


def _case(op: str, kind: str, mode: str) -> object:
    bug = known_bug(op, kind, mode)
    marks = [pytest.mark.xfail(strict=True, reason=f"known bug: {bug}")] if bug else []
    return pytest.param(op, kind, mode, marks=marks, id=f"{op}-{kind}-{mode}")


def applies(op: str, kind: str) -> bool:
    """Whether the fault can hit the operation (a body to damage on the way up)."""
    return kind != "corrupt_request" or op in UPLOAD_OPS


CASES = [_case(*case) for case in itertools.product(OPS, KINDS, MODES) if applies(*case[:2])]
#: The reads: a dataset's direct reads and a checkpoint's ranged load, on both
#: bucket kinds (tests/bucket_kinds.py); on a zonal one over bidi read streams.
READ_OPS = ("get", "ranged_get")


def uri_of(bucket: Bucket, op: str) -> str:
    """What an error must name: the listed prefix, the checkpoint, or an object."""
    if op == "list":
        return bucket.uri("d/")
    if op in DATASET_OPS:
        return bucket.uri("d/")  # an object under it
    return bucket.uri(CKPT_KEY)


def check_case(bucket: Bucket, op: str, kind: str, mode: str) -> None:
    outcome, detail = run_case(bucket, op, kind, mode)
    if outcome == "error":
        assert isinstance(detail, StorageError)
        assert uri_of(bucket, op) in str(detail)
        if mode == "past_deadline" and kind not in ("corrupt", "corrupt_request"):
            assert isinstance(detail, DeadlineExceededError)
    assert outcome == expected(op, kind, mode), f"{outcome}: {detail!r}"
    assert bucket.composites() == []
    assert bucket.incomplete_uploads() == []


@pytest.mark.parametrize(("op", "kind", "mode"), [c for c in CASES if c.values[0] not in READ_OPS])
def test_fault(model_bucket: Bucket, op: str, kind: str, mode: str) -> None:
    check_case(model_bucket, op, kind, mode)


@pytest.mark.parametrize(("op", "kind", "mode"), [c for c in CASES if c.values[0] in READ_OPS])
def test_read_fault(model_bucket: Bucket, op: str, kind: str, mode: str) -> None:
    check_case(model_bucket, op, kind, mode)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("workload", ["epoch", "load"])
def test_a_silent_read_is_abandoned_after_the_read_timeout(
    model_bucket: Bucket, workload: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A read that receives nothing for ``read_timeout`` is retried, not awaited.

    The stall outlasts the pytest timeout, and the attempt's own time limit is
    as long: only the silence limit (0.3 s) ends the wait. On gRPC it once did
    not apply, and a silent bidi read stream was awaited for ``attempt_timeout``.
    """
    import logging

    patient = dataclasses.replace(RECOVER, attempt_timeout=30.0)
    emu = model_bucket.emu
    if workload == "epoch":
        want = model_bucket.seed_dataset(10)
    else:
        ck = model_bucket.checkpoint(patient)
        ck.save(state(1), model_bucket.uri(CKPT_KEY))
    emu.add_fault("get", "stall", nth=2, stall_seconds=30.0)
    with caplog.at_level(logging.DEBUG, logger="torchbucket"):
        if workload == "epoch":
            check_epoch(epoch(model_bucket.dataset(patient, compose=False)), want)
        else:
            assert same_state(ck.load(model_bucket.uri(CKPT_KEY), weights_only=True), state(1))
    assert sum(rule["fired"] for rule in emu.faults()) == 1
    # Cut short for its silence (retried, or over HTTP hedged), never for the
    # attempt's time limit.
    assert not [r for r in caplog.records if "attempt timeout" in r.getMessage()]


#: On fake-gcs-server (the fidelity reference, slow): every operation with a
#: status fault repeated and a body fault once, and stalls past the deadline
#: on a read and a part.
FAKE_GCS_CASES = [
    *(_case(op, "503", "repeated") for op in OPS),
    *(_case(op, "truncate", "once") for op in OPS),
    *(_case(op, "corrupt_request", "once") for op in UPLOAD_OPS),
    _case("get", "stall", "past_deadline"),
    _case("mpu_part", "stall", "past_deadline"),
]


@pytest.mark.parametrize(("op", "kind", "mode"), FAKE_GCS_CASES)
def test_fault_on_fake_gcs(
    fake_gcs: Emulator, make_bucket: Callable[[Emulator], Bucket], op: str, kind: str, mode: str
) -> None:
    check_case(make_bucket(fake_gcs), op, kind, mode)


def test_an_unexpected_error_in_a_compose_group_reaches_the_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not a hang: the iterable dataset's window once waited forever for such a group."""
    import uuid

    from torchbucket import runtime
    from torchbucket.compose import ComposeConfig
    from torchbucket.datasets import BucketIterableDataset
    from torchbucket.storage import store_for
    from torchbucket.storage.memory import MemoryStore

    store, _ = store_for(f"memory://rel-{uuid.uuid4().hex[:8]}/")
    for i in range(8):
        runtime.run(store.put(f"d/{i}", b"x" * (i + 1)))

    async def broken(*args: object, **kwargs: object) -> object:
        raise ValueError("not a torchbucket error")

    monkeypatch.setattr(MemoryStore, "compose", broken)
    ds = BucketIterableDataset.from_prefix(store.uri("d/"), compose=ComposeConfig())
    with pytest.raises(ValueError, match="not a torchbucket error"):
        list(ds)


# -- DCP: two saves to one place, and a data file replaced after a save ----------


def _dcp_state(value: float) -> dict[str, object]:
    """Job A's (1.0) or job B's (2.0) state: eight tensors, two to a data file."""
    import torch

    return {f"t{i}": torch.full((16384,), value) for i in range(8)}


def _dcp_load(bucket: Bucket, uri: str) -> dict[str, object]:
    import torch.distributed.checkpoint as dcp

    from torchbucket.dcp import BucketStorageReader

    target = _dcp_state(0.0)
    dcp.load(target, storage_reader=BucketStorageReader(uri, gcs=bucket.gcs()))
    return target


def _dcp_writer(bucket: Bucket, uri: str) -> object:
    from torchbucket.checkpoint import CheckpointConfig
    from torchbucket.dcp import BucketStorageWriter

    # 32 KiB parts: each 128 KiB data file is a multipart upload (its name in the URL).
    config = CheckpointConfig(part_size=32 * 1024, min_part_size=1024)
    return BucketStorageWriter(uri, checkpoint=config, gcs=bucket.gcs(), files_per_rank=4)


def _wait_fired(emu: Emulator) -> None:
    """Until the fault has fired (the request it holds has arrived)."""
    import time

    for _ in range(400):
        if any(rule["fired"] for rule in emu.faults()):
            return
        time.sleep(0.05)
    raise AssertionError("the fault never fired: the case tested nothing")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_concurrent_dcp_saves_never_mix(model_bucket: Bucket, bucket_kind: str) -> None:
    """Job A saves 1.0s, one of its data files held; job B saves 2.0s meanwhile, whole.

    Both jobs write ``gs://.../run/step`` with four data files each. The load
    gives all of one job's tensors, never some of each; a job that lost fails
    with an error naming the checkpoint and leaves none of its files behind.
    """
    import threading

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from bucket_kinds import stored_names

    emu, uri = model_bucket.emu, model_bucket.uri("run/step")
    # Held: the upload's completion; on a zonal bucket, where a data file is
    # one gRPC write stream, that stream.
    op = "put" if bucket_kind == "zonal" else "mpu_complete"
    emu.add_fault(op, "stall_apply", match="__0_2.", stall_seconds=STALL_SECONDS)
    outcome: dict[str, BaseException | None] = {}

    def save(job: str, value: float) -> None:
        try:
            dcp.save(_dcp_state(value), storage_writer=_dcp_writer(model_bucket, uri))
            outcome[job] = None
        except CheckpointException as exc:
            outcome[job] = exc

    job_a = threading.Thread(target=save, args=("A", 1.0))
    job_a.start()
    try:
        _wait_fired(emu)  # A's third data file is held: B starts now
        save("B", 2.0)
    finally:
        job_a.join()
        emu.clear_faults()
    loaded = _dcp_load(model_bucket, uri)
    values = set(torch.cat(list(loaded.values())).unique().tolist())  # type: ignore[arg-type]
    assert values in ({1.0}, {2.0}), f"tensors of both saves loaded together: {values}"
    winner = "A" if values == {1.0} else "B"
    loser = "B" if winner == "A" else "A"
    assert outcome[winner] is None
    if outcome[loser] is not None:
        assert uri in str(outcome[loser]) and "finished first" in str(outcome[loser])
    # The winner's four data files and its metadata, nothing of the other job.
    assert len(stored_names(emu, model_bucket.name, "run/step/")) == 5
    assert model_bucket.incomplete_uploads() == []


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_replaced_dcp_data_file_is_refused(model_bucket: Bucket) -> None:
    """A data file re-uploaded with one bit flipped after the save: the load fails, naming it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from torchbucket import runtime
    from torchbucket.errors import CheckpointError

    uri = model_bucket.uri("run/step")
    dcp.save(_dcp_state(1.0), storage_writer=_dcp_writer(model_bucket, uri))
    name = next(n for n in model_bucket.emu.object_names(model_bucket.name, "run/step/__0_1."))
    store = model_bucket.store()
    try:
        data = bytearray(runtime.run(store.get(name)))
        data[-1000] ^= 0x10  # inside the last tensor's bytes
        runtime.run(store.put(name, bytes(data)))
    finally:
        runtime.run(store.close())
    with pytest.raises(CheckpointException) as caught:
        _dcp_load(model_bucket, uri)
    error, _ = caught.value.failures[0]
    assert isinstance(error, CheckpointError), repr(error)
    assert model_bucket.uri(name) in str(error) and "replaced" in str(error)


#: Per operation: the workload that meets the fault, and what the product does.
WHAT = {
    "list": ("dataset listing", "page retried"),
    "get": ("dataset epoch, direct reads", "retried; CRC32C catches a corrupt body"),
    "compose": (
        "dataset epoch, compose on",
        "retried (ifGenerationMatch=0; a lost answer is recognised by 412 + HEAD); past "
        "the deadline, or when a damaged request is refused, the group is read directly",
    ),
    "delete": (
        "dataset epoch, compose on",
        "composite delete pinned to its generation, retried; past the deadline it stays "
        "registered and is deleted at exit",
    ),
    "ranged_get": (
        "checkpoint load, 64 KiB ranges",
        "ranges retried; a corrupt range fails the load's CRC32C and the load is read once more",
    ),
    "put": (
        "checkpoint save, one part (simple upload)",
        "retried: after an uncertain failure a HEAD recognises a write that took effect "
        "(size + CRC32C), else the repeat is pinned to the generation seen; declares its "
        "CRC32C, so damaged bytes are refused (400) and sent again",
    ),
    "resumable": (
        "checkpoint save, 256 KiB chunks",
        "a chunk is retried after asking the session how much it holds; a final chunk "
        "unanswered until the deadline is recognised by a HEAD; the final chunk declares "
        "the whole CRC32C, so damaged bytes are refused and the save fails",
    ),
    "mpu_initiate": (
        "checkpoint save, 64 KiB parts",
        "retried; after a lost answer the uploads it may have begun are aborted",
    ),
    "mpu_part": (
        "checkpoint save, 64 KiB parts",
        "retried; each part declares its CRC32C, so a damaged part is refused and sent "
        "again; past the deadline the upload is aborted",
    ),
    "mpu_complete": (
        "checkpoint save, 64 KiB parts",
        "retried; a lost answer is recognised by NoSuchUpload + HEAD, and past the "
        "deadline by a HEAD (size + CRC32C of what was written); assembled under a "
        "staging name, checked, then copied onto the checkpoint",
    ),
}


def table() -> str:
    """The matrix as a Markdown table: one row per operation, one column per fault.

    Each cell gives the outcome hit once / three times / past the deadline:
    ``ok`` exact data, ``err`` a clear error naming the URI with nothing damaged,
    ``BUG`` a reported bug (strict xfail).
    """
    lines = [
        "| operation | workload | what the product does | " + " | ".join(KINDS) + " |",
        "|---|---|---|" + "---|" * len(KINDS),
    ]
    for op in OPS:
        cells = []
        for kind in KINDS:
            if not applies(op, kind):
                cells.append("n/a")
                continue
            marks = []
            for mode in MODES:
                mark = "ok" if expected(op, kind, mode) == "ok" else "err"
                marks.append("**BUG**" if known_bug(op, kind, mode) else mark)
            cells.append("/".join(marks))
        workload, does = WHAT[op]
        lines.append(f"| {op} | {workload} | {does} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
    sys.exit(0)
