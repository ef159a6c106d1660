"""The emulator's XML API (path-style objects and multipart uploads) on both stores."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import google_crc32c
import pytest

from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

Http = Callable[..., Any]


@pytest.fixture(params=["model", "fake-gcs"])
def emu(request: pytest.FixtureRequest) -> Emulator:
    return request.getfixturevalue(  # type: ignore[no-any-return]
        "emulator" if request.param == "model" else "fake_gcs"
    )


@pytest.fixture
def bucket(emu: Emulator) -> str:
    name = f"x-{uuid.uuid4().hex[:16]}"
    emu.create_bucket(name)
    return name


def _text(body: bytes, tag: str) -> list[str]:
    root = ET.fromstring(body)
    return [el.text or "" for el in root.iter() if el.tag.rsplit("}", 1)[-1] == tag]


def _complete_body(parts: list[tuple[int, str]]) -> bytes:
    rows = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>" for n, e in parts)
    return f"<CompleteMultipartUpload>{rows}</CompleteMultipartUpload>".encode()


def test_simple_put_and_ranged_get(emu: Emulator, bucket: str, raw_http: Http) -> None:
    data = b"0123456789" * 10
    put = raw_http(emu, "PUT", f"/{bucket}/dir/a%20b", data)
    assert put.status == 200, put
    assert put.headers["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    assert raw_http(emu, "GET", f"/{bucket}/dir/a%20b").body == data
    part = raw_http(emu, "GET", f"/{bucket}/dir/a%20b", headers={"Range": "bytes=5-14"})
    assert part.status == 206 and part.body == data[5:15]
    assert emu.object_names(bucket) == ["dir/a b"]
    missing = raw_http(emu, "GET", f"/{bucket}/nope")
    assert missing.status == 404
    assert _text(missing.body, "Code") == ["NoSuchKey"]


def test_multipart_upload_round_trip(emu: Emulator, bucket: str, raw_http: Http) -> None:
    key = "ckpt/model.pt"
    start = raw_http(emu, "POST", f"/{bucket}/{quote(key)}?uploads")
    assert start.status == 200, start
    assert _text(start.body, "Bucket") == [bucket]
    assert _text(start.body, "Key") == [key]
    (upload_id,) = _text(start.body, "UploadId")
    chunks = {1: b"a" * 1000, 2: b"b" * 1000, 3: b"c" * 10}
    etags = {}
    for number in (3, 1, 2):  # parts may arrive in any order
        reply = raw_http(
            emu,
            "PUT",
            f"/{bucket}/{quote(key)}?partNumber={number}&uploadId={upload_id}",
            chunks[number],
        )
        assert reply.status == 200
        etags[number] = reply.headers["ETag"]
        # The part's CRC32C, which google-resumable-media's XMLMPUPart checks.
        crc = base64.b64encode(google_crc32c.value(chunks[number]).to_bytes(4, "big")).decode()
        assert reply.headers["x-goog-hash"] == f"crc32c={crc}"
    assert len(set(etags.values())) == 3  # every part has its own tag
    listed = raw_http(emu, "GET", f"/{bucket}?uploads&prefix=ckpt/")
    assert upload_id in _text(listed.body, "UploadId")
    assert raw_http(emu, "GET", f"/{bucket}/{quote(key)}").status == 404  # not visible yet
    done = raw_http(
        emu,
        "POST",
        f"/{bucket}/{quote(key)}?uploadId={upload_id}",
        _complete_body([(n, etags[n]) for n in (1, 2, 3)]),
    )
    assert done.status == 200, done
    assert _text(done.body, "Key") == [key]
    got = raw_http(emu, "GET", f"/{bucket}/{quote(key)}")
    assert got.body == chunks[1] + chunks[2] + chunks[3]
    if emu.backend == "model":  # as GCS: a CRC32C but no MD5 (fake-gcs-server keeps one)
        whole = google_crc32c.value(got.body).to_bytes(4, "big")
        assert got.headers["x-goog-hash"] == f"crc32c={base64.b64encode(whole).decode()}"
    after = raw_http(emu, "GET", f"/{bucket}?uploads&prefix=ckpt/")
    assert upload_id not in _text(after.body, "UploadId")


def _multipart(raw_http: Http, emu: Emulator, bucket: str, key: str, parts: list[bytes]) -> None:
    start = raw_http(emu, "POST", f"/{bucket}/{quote(key)}?uploads")
    (upload_id,) = _text(start.body, "UploadId")
    etags = []
    for number, part in enumerate(parts, 1):
        path = f"/{bucket}/{quote(key)}?partNumber={number}&uploadId={upload_id}"
        etags.append((number, raw_http(emu, "PUT", path, part).headers["ETag"]))
    done = raw_http(
        emu, "POST", f"/{bucket}/{quote(key)}?uploadId={upload_id}", _complete_body(etags)
    )
    assert done.status == 200, done


def test_a_completed_upload_reads_alike_on_every_path(
    emu: Emulator, bucket: str, raw_http: Http
) -> None:
    # The model store keeps a completed upload as its parts (emulator/_pieces):
    # every read, whole or ranged, within a part or across parts, and every
    # object made from it, must see the joined bytes.
    parts = [os.urandom(1000), os.urandom(777), os.urandom(1500)]
    data = b"".join(parts)
    _multipart(raw_http, emu, bucket, "big", parts)
    assert raw_http(emu, "GET", f"/{bucket}/big").body == data
    json_path = f"/storage/v1/b/{bucket}/o/big"
    for first, last in ((0, 9), (10, 999), (990, 1010), (500, 3000), (1777, 1777), (0, 3276)):
        for path in (f"/{bucket}/big", json_path + "?alt=media"):
            got = raw_http(emu, "GET", path, headers={"Range": f"bytes={first}-{last}"})
            assert got.status == 206 and got.body == data[first : last + 1], (path, first, last)
    meta = raw_http(emu, "GET", json_path).json()
    crc = base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()
    assert (meta["size"], meta["crc32c"]) == (str(len(data)), crc)
    raw_http(emu, "PUT", f"/{bucket}/tail", b"tail")
    composed = raw_http(
        emu,
        "POST",
        json_path.replace("/o/big", "/o/both") + "/compose",
        json.dumps({"sourceObjects": [{"name": "big"}, {"name": "tail"}]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert composed.status == 200, composed
    assert raw_http(emu, "GET", f"/{bucket}/both").body == data + b"tail"
    copied = raw_http(emu, "POST", f"{json_path}/rewriteTo/b/{bucket}/o/again")
    assert copied.status == 200, copied
    got = raw_http(emu, "GET", f"/{bucket}/again", headers={"Range": "bytes=999-1777"})
    assert got.body == data[999:1778]


def test_a_completed_upload_streams_whole_under_the_bandwidth_model(raw_http: Http) -> None:
    # Past 4 MiB a body under a latency model goes out in timed chunks
    # (emulator/_server._stream), here taken from the parts one after another.
    parts = [os.urandom(2_000_000), os.urandom(3_000_000), os.urandom(5)]
    with Emulator(latency="same-region") as emu:
        emu.create_bucket("b")
        _multipart(raw_http, emu, "b", "big", parts)
        got = raw_http(emu, "GET", "/storage/v1/b/b/o/big?alt=media")
    assert got.status == 200 and got.body == b"".join(parts)
    assert int(got.headers["Content-Length"]) == 5_000_005


def test_multipart_complete_validates_parts(emu: Emulator, bucket: str, raw_http: Http) -> None:
    start = raw_http(emu, "POST", f"/{bucket}/obj?uploads")
    (upload_id,) = _text(start.body, "UploadId")
    e1 = raw_http(emu, "PUT", f"/{bucket}/obj?partNumber=1&uploadId={upload_id}", b"x").headers[
        "ETag"
    ]
    e2 = raw_http(emu, "PUT", f"/{bucket}/obj?partNumber=2&uploadId={upload_id}", b"y").headers[
        "ETag"
    ]
    path = f"/{bucket}/obj?uploadId={upload_id}"
    backwards = raw_http(emu, "POST", path, _complete_body([(2, e2), (1, e1)]))
    assert backwards.status == 400
    assert _text(backwards.body, "Code") == ["InvalidPartOrder"]
    wrong = raw_http(emu, "POST", path, _complete_body([(1, e2)]))
    assert wrong.status == 400
    assert _text(wrong.body, "Code") == ["InvalidPart"]
    assert emu.object_names(bucket) == []
    aborted = raw_http(emu, "DELETE", path)
    assert aborted.status == 204
    gone = raw_http(emu, "POST", path, _complete_body([(1, e1)]))
    assert gone.status == 404
    assert _text(gone.body, "Code") == ["NoSuchUpload"]


def test_multipart_on_a_missing_bucket(emu: Emulator, raw_http: Http) -> None:
    reply = raw_http(emu, "POST", "/no-such-bucket-xyz/obj?uploads")
    assert reply.status == 404
    assert _text(reply.body, "Code") == ["NoSuchBucket"]


def test_minimum_part_size_when_configured(raw_http: Http) -> None:
    with Emulator(min_part_size=1000) as emu:
        emu.create_bucket("b")
        start = raw_http(emu, "POST", "/b/obj?uploads")
        (upload_id,) = _text(start.body, "UploadId")
        etags = [
            raw_http(emu, "PUT", f"/b/obj?partNumber={n}&uploadId={upload_id}", data).headers[
                "ETag"
            ]
            for n, data in ((1, b"s" * 10), (2, b"t" * 10))
        ]
        small = raw_http(
            emu,
            "POST",
            f"/b/obj?uploadId={upload_id}",
            _complete_body([(1, etags[0]), (2, etags[1])]),
        )
        assert small.status == 400
        assert _text(small.body, "Code") == ["EntityTooSmall"]
        # A single part may be small: it is the last one.
        single = raw_http(
            emu, "POST", f"/b/obj?uploadId={upload_id}", _complete_body([(1, etags[0])])
        )
        assert single.status == 200
