"""The emulator's GCS JSON API, spoken with plain HTTP, on both stores.

The same assertions run on the model store and on fake-gcs-server behind the
front server: a difference between them is a bug in one of them.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

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
    name = f"j-{uuid.uuid4().hex[:16]}"
    emu.create_bucket(name)
    return name


def _o(bucket: str, name: str, query: str = "") -> str:
    path = f"/storage/v1/b/{bucket}/o/{quote(name, safe='')}"
    return f"{path}?{query}" if query else path


def _upload(raw_http: Http, emu: Emulator, bucket: str, name: str, data: bytes, **q: str) -> Any:
    query = urlencode({"uploadType": "media", "name": name, **q})
    return raw_http(emu, "POST", f"/upload/storage/v1/b/{bucket}/o?{query}", data)


def _list(raw_http: Http, emu: Emulator, bucket: str, **q: Any) -> Any:
    reply = raw_http(emu, "GET", f"/storage/v1/b/{bucket}/o?{urlencode(q)}")
    assert reply.status == 200, reply
    return reply.json()


def _crc(data: bytes) -> str:
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


def test_list_pages_hold_at_most_1000_entries(emu: Emulator, bucket: str, raw_http: Http) -> None:
    count = 2300 if emu.backend == "model" else 1010  # fake-gcs-server seeds slowly
    names = {f"n/{i:05d}": b"" for i in range(count)}
    emu.seed(bucket, names)
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        q: dict[str, Any] = {"prefix": "n/", "maxResults": 5000}
        if token:
            q["pageToken"] = token
        page = _list(raw_http, emu, bucket, **q)
        assert len(page.get("items", [])) <= 1000
        seen.extend(item["name"] for item in page.get("items", []))
        pages += 1
        token = page.get("nextPageToken")
        if not token:
            break
    assert seen == sorted(names)
    assert pages == -(-count // 1000)


def test_list_offsets_prefix_and_max_results(emu: Emulator, bucket: str, raw_http: Http) -> None:
    emu.seed(bucket, {name: b"x" for name in ["a/1", "a/2", "a/3", "a/4", "b/1", "c"]})
    page = _list(raw_http, emu, bucket, prefix="a/", startOffset="a/2", endOffset="a/4")
    assert [i["name"] for i in page["items"]] == ["a/2", "a/3"]
    first = _list(raw_http, emu, bucket, maxResults=2)
    assert [i["name"] for i in first["items"]] == ["a/1", "a/2"]
    rest = _list(raw_http, emu, bucket, pageToken=first["nextPageToken"])
    assert [i["name"] for i in rest["items"]] == ["a/3", "a/4", "b/1", "c"]
    assert "nextPageToken" not in rest
    nested = _list(raw_http, emu, bucket, delimiter="/")
    assert nested["prefixes"] == ["a/", "b/"]
    assert [i["name"] for i in nested["items"]] == ["c"]


def test_object_resource_fields(emu: Emulator, bucket: str, raw_http: Http) -> None:
    data = b"hello world"
    created = _upload(raw_http, emu, bucket, "dir/obj", data).json()
    meta = raw_http(emu, "GET", _o(bucket, "dir/obj")).json()
    assert meta["name"] == "dir/obj"
    assert meta["size"] == str(len(data))  # a string, as GCS sends it
    assert meta["generation"] == created["generation"]
    assert meta["crc32c"] == _crc(data)
    assert meta["storageClass"] == "STANDARD"
    assert "md5Hash" in meta and "timeCreated" in meta
    gen = meta["generation"]
    assert raw_http(emu, "GET", _o(bucket, "dir/obj", "ifGenerationMatch=1")).status == 412
    assert raw_http(emu, "GET", _o(bucket, "dir/obj", f"ifGenerationMatch={gen}")).status == 200
    assert raw_http(emu, "GET", _o(bucket, "dir/obj", "alt=media&generation=1")).status == 404
    narrow = raw_http(emu, "GET", _o(bucket, "dir/obj", "fields=name,size")).json()
    assert narrow["name"] == "dir/obj" and narrow["size"] == str(len(data))


def test_ranged_and_whole_downloads(emu: Emulator, bucket: str, raw_http: Http) -> None:
    data = bytes(range(256)) * 4
    gen = _upload(raw_http, emu, bucket, "r", data).json()["generation"]
    whole = raw_http(emu, "GET", _o(bucket, "r", "alt=media"))
    assert whole.status == 200 and whole.body == data
    assert f"crc32c={_crc(data)}" in whole.headers["x-goog-hash"]
    assert "md5=" in whole.headers["x-goog-hash"]
    assert whole.headers["x-goog-generation"] == gen
    part = raw_http(emu, "GET", _o(bucket, "r", "alt=media"), headers={"Range": "bytes=10-19"})
    assert part.status == 206
    assert part.body == data[10:20]
    assert part.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
    tail = raw_http(emu, "GET", _o(bucket, "r", "alt=media"), headers={"Range": "bytes=-5"})
    assert tail.status == 206 and tail.body == data[-5:]
    beyond = raw_http(emu, "GET", _o(bucket, "r", "alt=media"), headers={"Range": "bytes=5000-"})
    assert beyond.status == 416
    alias = raw_http(emu, "GET", f"/download/storage/v1/b/{bucket}/o/r?alt=media")
    assert alias.status == 200 and alias.body == data


def test_missing_object_and_bucket_answer_404_in_gcs_shape(
    emu: Emulator, bucket: str, raw_http: Http
) -> None:
    missing = raw_http(emu, "GET", _o(bucket, "nope", "alt=media"))
    assert missing.status == 404
    assert missing.json()["error"]["code"] == 404
    assert missing.json()["error"]["errors"][0]["reason"] == "notFound"
    assert raw_http(emu, "GET", "/storage/v1/b/no-such-bucket-xyz/o").status == 404
    assert raw_http(emu, "GET", "/storage/v1/b/no-such-bucket-xyz").status == 404


def test_multipart_upload_and_generation_preconditions(
    emu: Emulator, bucket: str, raw_http: Http
) -> None:
    boundary = "b0undary"
    body = (
        f'--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{{"name": "mp"}}'
        f"\r\n--{boundary}\r\nContent-Type: text/plain\r\n\r\nmultipart body\r\n--{boundary}--\r\n"
    ).encode()
    reply = raw_http(
        emu,
        "POST",
        f"/upload/storage/v1/b/{bucket}/o?uploadType=multipart&ifGenerationMatch=0",
        body,
        headers={"Content-Type": f"multipart/related; boundary={boundary}"},
    )
    assert reply.status == 200, reply
    gen = reply.json()["generation"]
    got = raw_http(emu, "GET", _o(bucket, "mp", "alt=media"))
    assert got.body == b"multipart body"
    # ifGenerationMatch=0: must not exist.
    assert _upload(raw_http, emu, bucket, "mp", b"again", ifGenerationMatch="0").status == 412
    assert _upload(raw_http, emu, bucket, "mp", b"v2", ifGenerationMatch=gen).status == 200
    assert raw_http(emu, "GET", _o(bucket, "mp", "alt=media")).body == b"v2"


def test_resumable_upload_in_chunks(emu: Emulator, bucket: str, raw_http: Http) -> None:
    data = bytes(range(256)) * 1000  # 256,000 bytes
    host = emu.endpoint.removeprefix("http://").replace("127.0.0.1", "localhost")
    start = raw_http(
        emu,
        "POST",
        f"/upload/storage/v1/b/{bucket}/o?uploadType=resumable&name=big",
        b"{}",
        headers={"Content-Type": "application/json", "Host": host},
    )
    assert start.status == 200, start
    location = start.headers["Location"]
    # The session URL is built from the Host the client used.
    assert location.startswith(f"http://{host}/upload/storage/v1/b/{bucket}/o?")
    path = location[len(f"http://{host}") :]
    first = raw_http(emu, "PUT", path, data[:100_000], headers={"Content-Range": "bytes 0-99999/*"})
    assert first.status == 308
    assert first.headers["Range"] == "bytes=0-99999"
    status = raw_http(emu, "PUT", path, b"", headers={"Content-Range": "bytes */*"})
    assert status.status == 308 and status.headers["Range"] == "bytes=0-99999"
    last = raw_http(
        emu,
        "PUT",
        path,
        data[100_000:],
        headers={"Content-Range": f"bytes 100000-{len(data) - 1}/{len(data)}"},
    )
    assert last.status == 200, last
    assert last.json()["size"] == str(len(data))
    assert raw_http(emu, "GET", _o(bucket, "big", "alt=media")).body == data


def test_compose_up_to_32_sources(emu: Emulator, bucket: str, raw_http: Http) -> None:
    parts = {f"p{i:02d}": bytes([i]) * (i + 1) for i in range(33)}
    emu.seed(bucket, parts)
    gens = {n: raw_http(emu, "GET", _o(bucket, n)).json()["generation"] for n in sorted(parts)[:32]}
    sources = [{"name": n, "generation": g} for n, g in gens.items()]
    ok = raw_http(
        emu,
        "POST",
        _o(bucket, "whole") + "/compose",
        json.dumps({"sourceObjects": sources, "destination": {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert ok.status == 200, ok
    expected = b"".join(parts[n] for n in sorted(parts)[:32])
    assert ok.json()["crc32c"] == _crc(expected)
    assert raw_http(emu, "GET", _o(bucket, "whole", "alt=media")).body == expected
    too_many = [{"name": n} for n in sorted(parts)]
    refused = raw_http(
        emu,
        "POST",
        _o(bucket, "whole2") + "/compose",
        json.dumps({"sourceObjects": too_many}).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert refused.status == 400
    assert raw_http(emu, "GET", _o(bucket, "whole2")).status == 404
    stale = [{"name": "p00", "objectPreconditions": {"ifGenerationMatch": "1"}}]
    failed = raw_http(
        emu,
        "POST",
        _o(bucket, "whole3") + "/compose",
        json.dumps({"sourceObjects": stale}).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert failed.status == 412


def test_delete_copy_and_rewrite(emu: Emulator, bucket: str, raw_http: Http) -> None:
    gen = _upload(raw_http, emu, bucket, "src", b"payload").json()["generation"]
    copied = raw_http(emu, "POST", _o(bucket, "src") + f"/copyTo/b/{bucket}/o/dst1")
    assert copied.status == 200 and copied.json()["name"] == "dst1"
    rewritten = raw_http(emu, "POST", _o(bucket, "src") + f"/rewriteTo/b/{bucket}/o/dst2")
    assert rewritten.status == 200
    assert rewritten.json()["done"] is True
    assert rewritten.json()["resource"]["name"] == "dst2"
    for name in ("dst1", "dst2"):
        assert raw_http(emu, "GET", _o(bucket, name, "alt=media")).body == b"payload"
    assert raw_http(emu, "DELETE", _o(bucket, "src", "generation=1")).status == 404
    assert raw_http(emu, "DELETE", _o(bucket, "src", f"generation={gen}")).status == 204
    assert raw_http(emu, "GET", _o(bucket, "src")).status == 404
    assert emu.object_names(bucket) == ["dst1", "dst2"]


def test_buckets_and_permissions(emu: Emulator, bucket: str, raw_http: Http) -> None:
    assert raw_http(emu, "GET", f"/storage/v1/b/{bucket}").json()["name"] == bucket
    again = raw_http(
        emu,
        "POST",
        "/storage/v1/b?project=p",
        json.dumps({"name": bucket}).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert again.status == 409
    perms = "permissions=storage.objects.get&permissions=storage.objects.create"
    granted = raw_http(emu, "GET", f"/storage/v1/b/{bucket}/iam/testPermissions?{perms}")
    assert granted.json()["permissions"] == ["storage.objects.get", "storage.objects.create"]
    emu.add_fault("iam", "403")
    denied = raw_http(emu, "GET", f"/storage/v1/b/{bucket}/iam/testPermissions?{perms}")
    assert denied.status == 200 and "permissions" not in denied.json()
