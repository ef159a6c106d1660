"""The emulator refuses an upload whose declared checksum is wrong, as GCS does.

On both stores, over HTTP: a simple (multipart/related) upload with a wrong
``crc32c`` or ``md5Hash``, a resumable upload whose finalizing request carries
a wrong ``x-goog-hash`` (or whose session declared a wrong ``crc32c``), an XML
multipart part with a wrong ``x-goog-hash`` or ``Content-MD5``, and an XML PUT
with a wrong hash: each is answered 400 with GCS's error, and nothing becomes
visible. And the fault that damages a request body in transit: without a
declared checksum the damaged bytes are stored (as on GCS); with one, the
upload is refused; and the GCS store, which always declares one, saves a
checkpoint intact through it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

import google_crc32c
import pytest
import torch

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.emulator import Emulator
from torchbucket.errors import IntegrityError
from torchbucket.storage.gcs import GCSConfig, GCSStore

pytestmark = pytest.mark.emulator

Http = Callable[..., Any]
DATA = b"checkpoint bytes " * 4000
WRONG_CRC = base64.b64encode((google_crc32c.value(DATA) ^ 1).to_bytes(4, "big")).decode()
WRONG_MD5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()


def crc(data: bytes) -> str:
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


@pytest.fixture(params=["model", "fake-gcs"])
def emu(request: pytest.FixtureRequest) -> Emulator:
    return request.getfixturevalue(  # type: ignore[no-any-return]
        "emulator" if request.param == "model" else "fake_gcs"
    )


@pytest.fixture
def bucket(emu: Emulator) -> str:
    name = f"i-{uuid.uuid4().hex[:16]}"
    emu.create_bucket(name)
    return name


def multipart_related(meta: dict[str, Any], data: bytes) -> tuple[bytes, dict[str, str]]:
    boundary = "b-" + uuid.uuid4().hex
    body = b"".join(
        (
            f"--{boundary}\r\nContent-Type: application/json\r\n\r\n".encode(),
            json.dumps(meta).encode(),
            f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(),
            data,
            f"\r\n--{boundary}--\r\n".encode(),
        )
    )
    return body, {"Content-Type": f"multipart/related; boundary={boundary}"}


def json_message(body: bytes) -> tuple[str, str]:
    error = json.loads(body)["error"]
    return error["errors"][0]["reason"], error["message"]


def xml_code(body: bytes) -> str:
    root = ET.fromstring(body)
    return next(el.text or "" for el in root.iter() if el.tag.rsplit("}", 1)[-1] == "Code")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("crc32c", WRONG_CRC, f'Provided CRC32C "{WRONG_CRC}" doesn\'t match calculated CRC32C'),
        ("md5Hash", WRONG_MD5, f'Provided MD5 hash "{WRONG_MD5}" doesn\'t match calculated'),
    ],
)
def test_a_simple_upload_with_a_wrong_checksum_is_refused(
    emu: Emulator, bucket: str, raw_http: Http, field: str, value: str, message: str
) -> None:
    body, headers = multipart_related({"name": "o", field: value}, DATA)
    reply = raw_http(
        emu, "POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=multipart", body, headers=headers
    )
    assert reply.status == 400
    reason, text = json_message(reply.body)
    assert reason == "invalid" and text.startswith(message)
    assert emu.object_names(bucket, "") == []


def test_a_simple_upload_with_the_right_checksum_is_stored(
    emu: Emulator, bucket: str, raw_http: Http
) -> None:
    body, headers = multipart_related({"name": "o", "crc32c": crc(DATA)}, DATA)
    reply = raw_http(
        emu, "POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=multipart", body, headers=headers
    )
    assert reply.status == 200, reply
    assert reply.json()["crc32c"] == crc(DATA)


def start_session(emu: Emulator, bucket: str, raw_http: Http, meta: dict[str, Any]) -> str:
    reply = raw_http(
        emu,
        "POST",
        f"/upload/storage/v1/b/{bucket}/o?uploadType=resumable&name=o",
        json.dumps(meta).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert reply.status == 200, reply
    location: str = reply.headers["Location"]
    return location[location.index("/upload/") :]


@pytest.mark.parametrize("where", ["x-goog-hash", "metadata"])
def test_a_resumable_upload_with_a_wrong_crc32c_is_refused(
    emu: Emulator, bucket: str, raw_http: Http, where: str
) -> None:
    meta = {"name": "o", "crc32c": WRONG_CRC} if where == "metadata" else {"name": "o"}
    session = start_session(emu, bucket, raw_http, meta)
    half = 256 * 1024 if len(DATA) > 256 * 1024 else len(DATA) // 2
    first = raw_http(
        emu,
        "PUT",
        session,
        DATA[:half],
        headers={"Content-Range": f"bytes 0-{half - 1}/*"},
    )
    assert first.status == 308
    headers = {"Content-Range": f"bytes {half}-{len(DATA) - 1}/{len(DATA)}"}
    if where == "x-goog-hash":
        headers["x-goog-hash"] = f"crc32c={WRONG_CRC}"
    last = raw_http(emu, "PUT", session, DATA[half:], headers=headers)
    assert last.status == 400
    assert json_message(last.body)[1].startswith(f'Provided CRC32C "{WRONG_CRC}"')
    assert emu.object_names(bucket, "") == []


def test_a_resumable_upload_with_the_right_crc32c_is_stored(
    emu: Emulator, bucket: str, raw_http: Http
) -> None:
    session = start_session(emu, bucket, raw_http, {"name": "o"})
    reply = raw_http(
        emu,
        "PUT",
        session,
        DATA,
        headers={
            "Content-Range": f"bytes 0-{len(DATA) - 1}/{len(DATA)}",
            "x-goog-hash": f"crc32c={crc(DATA)}",
        },
    )
    assert reply.status == 200, reply
    assert emu.object_names(bucket, "") == ["o"]


def initiate(emu: Emulator, bucket: str, raw_http: Http) -> str:
    reply = raw_http(emu, "POST", f"/{bucket}/big?uploads", b"")
    assert reply.status == 200, reply
    root = ET.fromstring(reply.body)
    return next(el.text or "" for el in root.iter() if el.tag.rsplit("}", 1)[-1] == "UploadId")


@pytest.mark.parametrize(
    "headers",
    [
        {"x-goog-hash": f"crc32c={WRONG_CRC}"},
        {"x-goog-hash": f"md5={WRONG_MD5}"},
        {"Content-MD5": WRONG_MD5},
    ],
    ids=["crc32c", "md5", "content-md5"],
)
def test_a_part_with_a_wrong_checksum_is_refused_and_not_kept(
    emu: Emulator, bucket: str, raw_http: Http, headers: dict[str, str]
) -> None:
    upload_id = initiate(emu, bucket, raw_http)
    part = f"/{bucket}/big?partNumber=1&uploadId={upload_id}"
    reply = raw_http(emu, "PUT", part, DATA, headers=headers)
    assert reply.status == 400
    assert xml_code(reply.body) == "BadDigest"
    listed = raw_http(emu, "GET", f"/{bucket}/big?uploadId={upload_id}")
    assert b"<Part>" not in listed.body
    ok = raw_http(emu, "PUT", part, DATA, headers={"x-goog-hash": f"crc32c={crc(DATA)}"})
    assert ok.status == 200
    assert raw_http(emu, "DELETE", f"/{bucket}/big?uploadId={upload_id}").status == 204


def test_an_xml_put_with_a_wrong_checksum_is_refused(
    emu: Emulator, bucket: str, raw_http: Http
) -> None:
    reply = raw_http(
        emu, "PUT", f"/{bucket}/o", DATA, headers={"x-goog-hash": f"crc32c={WRONG_CRC}"}
    )
    assert reply.status == 400
    assert xml_code(reply.body) == "BadDigest"
    assert emu.object_names(bucket, "") == []


def test_a_body_damaged_in_transit_is_stored_when_no_checksum_was_declared(
    emu: Emulator, bucket: str, raw_http: Http
) -> None:
    """As on GCS: only a declared checksum lets the server tell."""
    emu.add_fault("put", "corrupt_request")
    body, headers = multipart_related({"name": "o"}, DATA)
    reply = raw_http(
        emu, "POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=multipart", body, headers=headers
    )
    assert reply.status == 200
    stored = raw_http(emu, "GET", f"/storage/v1/b/{bucket}/o/o?alt=media").body
    assert len(stored) == len(DATA) and stored != DATA


def test_a_body_damaged_in_transit_is_refused_when_a_checksum_was_declared(
    emu: Emulator, bucket: str, raw_http: Http
) -> None:
    emu.add_fault("put", "corrupt_request")
    body, headers = multipart_related({"name": "o", "crc32c": crc(DATA)}, DATA)
    reply = raw_http(
        emu, "POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=multipart", body, headers=headers
    )
    assert reply.status == 400
    assert emu.object_names(bucket, "") == []


@pytest.mark.parametrize(
    ("op", "method"),
    [("put", "multipart"), ("mpu_part", "multipart")],
)
def test_a_checkpoint_saved_through_damage_in_transit_loads_intact(
    emu: Emulator, bucket: str, op: str, method: str
) -> None:
    """The GCS store declares every checksum, so a damaged request is refused and sent again."""
    gcs = GCSConfig(endpoint=emu.endpoint, anonymous=True)
    part = 4 << 20 if op == "put" else 64 * 1024
    ck = BucketCheckpoint(
        config=CheckpointConfig(part_size=part, min_part_size=1024, upload_method=method),
        gcs=gcs,
    )
    uri = f"gs://{bucket}/run/ck.pt"
    state = {"w": torch.randn(300, 256, generator=torch.Generator().manual_seed(3))}
    emu.add_fault(op, "corrupt_request")
    ck.save(state, uri)
    assert sum(rule["fired"] for rule in emu.faults()) == 1
    assert torch.equal(ck.load(uri, weights_only=True)["w"], state["w"])
    assert emu.object_names(bucket, "") == ["run/ck.pt"]
    store = GCSStore(bucket, config=gcs)
    try:
        assert runtime.run(store.multipart_list("")) == []
    finally:
        runtime.run(store.close())


def test_a_streamed_save_damaged_in_transit_is_refused_and_the_previous_one_kept(
    emu: Emulator, bucket: str
) -> None:
    """A resumable upload is checked once, at the end: the damage fails the save."""
    gcs = GCSConfig(endpoint=emu.endpoint, anonymous=True, upload_chunk_size=256 * 1024)
    ck = BucketCheckpoint(
        config=CheckpointConfig(part_size=64 * 1024, min_part_size=1024, upload_method="resumable"),
        gcs=gcs,
    )
    uri = f"gs://{bucket}/run/ck.pt"
    before = {"w": torch.randn(300, 256, generator=torch.Generator().manual_seed(1))}
    ck.save(before, uri)
    emu.add_fault("resumable", "corrupt_request", nth=2)  # a chunk, not the session start
    with pytest.raises(IntegrityError, match="doesn't match calculated CRC32C") as caught:
        ck.save({"w": torch.randn(300, 256)}, uri)
    assert uri in str(caught.value)
    assert torch.equal(ck.load(uri, weights_only=True)["w"], before["w"])
    assert emu.object_names(bucket, "") == ["run/ck.pt"]
