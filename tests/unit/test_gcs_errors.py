"""The one mapping from GCS answers to torchbucket errors, and GCSConfig."""

from __future__ import annotations

import asyncio
import pickle
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import aiohttp
import pytest

from torchbucket.errors import (
    BucketNotFoundError,
    ConfigError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionFailedError,
    StorageError,
    ThrottledError,
    TransientError,
)
from torchbucket.storage.gcs import GCSConfig, GCSStore
from torchbucket.storage.gcs._errors import (
    error_for_exception,
    error_for_response,
    parse_body,
    parse_info,
    parse_json,
)
from torchbucket.storage.gcs._session import user_agent
from torchbucket.storage.gcs._xml import parse_upload_id

URI = "gs://bkt/some/key"


def _json_error(code: int, reason: str, message: str) -> bytes:
    return (
        f'{{"error": {{"code": {code}, "message": "{message}", '
        f'"errors": [{{"reason": "{reason}", "message": "{message}"}}]}}}}'
    ).encode()


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, StorageError),
        (401, PermissionDeniedError),
        (403, PermissionDeniedError),
        (404, NotFoundError),
        (405, StorageError),
        (408, TransientError),
        (412, PreconditionFailedError),
        (429, ThrottledError),
        (500, TransientError),
        (501, StorageError),  # Not Implemented: final (Google's retry strategy)
        (502, TransientError),
        (503, ThrottledError),
        (504, TransientError),
    ],
)
def test_status_maps_to_one_error_type(status: int, expected: type[StorageError]) -> None:
    error = error_for_response(
        status, {}, _json_error(status, "reason", "what happened"), operation="get", uri=URI
    )
    assert type(error) is expected
    assert error.status == status
    assert str(error) == f"get {URI}: what happened (HTTP {status})"


def test_404_on_a_bucket_operation_is_a_missing_bucket() -> None:
    body = _json_error(404, "notFound", "The specified bucket does not exist.")
    error = error_for_response(404, {}, body, operation="list", uri="gs://bkt/", bucket_op=True)
    assert isinstance(error, BucketNotFoundError)
    assert isinstance(error, FileNotFoundError)
    assert "gs://bkt/" in str(error)


def test_xml_no_such_bucket_is_a_missing_bucket() -> None:
    body = (
        b'<?xml version="1.0"?><Error xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        b"<Code>NoSuchBucket</Code><Message>The specified bucket does not exist.</Message></Error>"
    )
    error = error_for_response(404, {}, body, operation="multipart initiate", uri=URI)
    assert isinstance(error, BucketNotFoundError)


def test_xml_no_such_upload_is_not_found() -> None:
    body = b"<Error><Code>NoSuchUpload</Code><Message>gone</Message></Error>"
    error = error_for_response(404, {}, body, operation="multipart abort", uri=URI)
    assert type(error) is NotFoundError
    assert "gone" in str(error)


def test_retry_after_in_seconds_and_as_a_date() -> None:
    error = error_for_response(429, {"Retry-After": "7"}, b"", operation="get", uri=URI)
    assert isinstance(error, ThrottledError)
    assert error.retry_after == 7.0
    when = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    error = error_for_response(503, {"Retry-After": when}, b"", operation="get", uri=URI)
    assert isinstance(error, ThrottledError)
    assert error.retry_after is not None and 20 < error.retry_after <= 31
    error = error_for_response(429, {"Retry-After": "soon"}, b"", operation="get", uri=URI)
    assert isinstance(error, ThrottledError) and error.retry_after is None


def test_plain_text_and_empty_bodies_still_name_the_uri() -> None:
    error = error_for_response(500, {}, b"upstream exploded", operation="put", uri=URI)
    assert str(error) == f"put {URI}: upstream exploded (HTTP 500)"
    error = error_for_response(502, {}, b"", operation="put", uri=URI)
    assert URI in str(error)


@pytest.mark.parametrize(
    "exc",
    [
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientPayloadError("truncated"),
        aiohttp.ClientConnectionError("refused"),
        aiohttp.ServerTimeoutError("slow"),
        asyncio.TimeoutError(),
        ConnectionResetError(),
    ],
)
def test_transport_failures_are_transient(exc: BaseException) -> None:
    error = error_for_exception(exc, operation="get", uri=URI)
    assert isinstance(error, TransientError)
    assert URI in str(error)


def test_other_exceptions_are_not_mapped() -> None:
    assert error_for_exception(ValueError("bug"), operation="get", uri=URI) is None


def test_user_agent_names_torchbucket_python_and_aiohttp() -> None:
    from torchbucket import __version__

    agent = user_agent()
    assert agent.startswith(f"torchbucket/{__version__} python/")
    assert f"aiohttp/{aiohttp.__version__}" in agent


def test_endpoint_comes_from_the_emulator_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    assert GCSConfig().resolved_endpoint() == ("http://127.0.0.1:4443", True)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "https://emu.example:9000/")
    assert GCSConfig().resolved_endpoint() == ("https://emu.example:9000", True)
    assert GCSConfig(anonymous=False).resolved_endpoint() == ("https://emu.example:9000", False)


def test_default_endpoint_is_credentialed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    assert GCSConfig().resolved_endpoint() == ("https://storage.googleapis.com", False)
    assert GCSConfig(anonymous=True).resolved_endpoint()[1] is True
    assert GCSConfig(endpoint="http://localhost:8080").resolved_endpoint()[1] is True


@pytest.mark.parametrize(
    "kwargs",
    [
        {"endpoint": "storage.googleapis.com"},
        {"upload_chunk_size": 1000},
        {"upload_chunk_size": 0},
        {"max_simple_upload_size": -1},
        {"connect_timeout": 0},
    ],
)
def test_bad_config_values_fail_on_construction(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        GCSConfig(**kwargs)  # type: ignore[arg-type]


def test_store_pickles_as_its_bucket_and_config() -> None:
    config = GCSConfig(endpoint="http://127.0.0.1:1", upload_chunk_size=512 * 1024)
    store = GCSStore("my-bucket", config=config)
    clone = pickle.loads(pickle.dumps(store))
    assert isinstance(clone, GCSStore)
    assert clone.bucket == "my-bucket"
    assert clone.config == config
    assert clone.uri("a/b") == "gs://my-bucket/a/b"


def test_store_for_a_gs_uri_gives_a_gcs_store_with_the_config() -> None:
    from torchbucket.storage import store_for

    config = GCSConfig(endpoint="http://127.0.0.1:1")
    store, key = store_for("gs://my-bucket/train/shard-", config=config)
    assert isinstance(store, GCSStore)
    assert (store.bucket, key, store.config) == ("my-bucket", "train/shard-", config)


@pytest.mark.parametrize(
    "body",
    [
        b'{"name": "k", "si\xffze": "3"}',  # one byte flipped: not UTF-8
        b'{"name": "k", "size": ',  # cut short
        b"[1, 2]",  # JSON, but not an object resource
        b'{"size": "3"}',  # no name
    ],
)
def test_a_garbled_json_answer_is_a_transient_error_naming_the_uri(body: bytes) -> None:
    with pytest.raises(TransientError) as info:
        parse_info(body, operation="put", uri=URI)
    assert str(info.value).startswith(f"put {URI}: garbled answer")
    assert info.value.__cause__ is not None
    with pytest.raises(TransientError):
        parse_json(body[:-1], operation="list", uri=URI)


def test_a_garbled_xml_answer_is_a_transient_error_naming_the_uri() -> None:
    good = (
        b"<InitiateMultipartUploadResult><UploadId>abc</UploadId></InitiateMultipartUploadResult>"
    )
    assert parse_body(parse_upload_id, good, operation="multipart initiate", uri=URI) == "abc"
    with pytest.raises(TransientError, match="multipart initiate gs://bkt/some/key: garbled"):
        parse_body(parse_upload_id, good[:30], operation="multipart initiate", uri=URI)
