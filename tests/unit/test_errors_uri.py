from __future__ import annotations

import pickle

import pytest

from torchbucket._uri import ObjectURI, join_key, parse_uri
from torchbucket.errors import (
    BucketNotFoundError,
    InvalidURIError,
    NotFoundError,
    PermissionDeniedError,
    StorageError,
    ThrottledError,
)


def test_builtin_bases_let_users_catch_what_they_know() -> None:
    assert issubclass(NotFoundError, FileNotFoundError)
    assert issubclass(BucketNotFoundError, FileNotFoundError)
    assert issubclass(PermissionDeniedError, PermissionError)
    assert issubclass(InvalidURIError, ValueError)


def test_storage_error_names_operation_uri_and_status() -> None:
    err = NotFoundError("object does not exist", operation="get", uri="gs://b/k", status=404)
    assert str(err) == "get gs://b/k: object does not exist (HTTP 404)"


def test_storage_errors_survive_pickling_across_processes() -> None:
    err = ThrottledError("slow down", operation="list", uri="gs://b/p/", status=429)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ThrottledError
    assert (back.operation, back.uri, back.status, back.message) == (
        "list",
        "gs://b/p/",
        429,
        "slow down",
    )


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("gs://bkt/a/b.jpg", ObjectURI("gs", "bkt", "a/b.jpg")),
        ("gs://bkt", ObjectURI("gs", "bkt", "")),
        ("gs://bkt/", ObjectURI("gs", "bkt", "")),
        ("memory://m/x/", ObjectURI("memory", "m", "x/")),
        ("file:///data/train/", ObjectURI("file", "/", "data/train/")),
        ("gs://my.bucket_1/ü/ñ", ObjectURI("gs", "my.bucket_1", "ü/ñ")),
    ],
)
def test_parse_uri(uri: str, expected: ObjectURI) -> None:
    assert parse_uri(uri) == expected


@pytest.mark.parametrize("uri", ["gs://bkt/a", "memory://m/x/y", "file:///data/train/x"])
def test_uri_round_trips(uri: str) -> None:
    assert str(parse_uri(uri)) == uri


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [
        ("bkt/a", "is not a URI"),
        ("s3://bkt/a", "unsupported scheme 's3'"),
        ("gs:///a", "names no bucket"),
        ("gs://Bad_Bucket/a", "not a valid GCS bucket name"),
        ("gs://ab/x", "not a valid GCS bucket name"),
        ("file://relative/path", "absolute path"),
        ("gs://bkt/a\nb", "newlines"),
    ],
)
def test_malformed_uris_say_what_is_wrong(uri: str, fragment: str) -> None:
    with pytest.raises(InvalidURIError, match=fragment) as info:
        parse_uri(uri)
    assert repr(uri) in str(info.value)


def test_non_string_uri_is_rejected() -> None:
    with pytest.raises(InvalidURIError, match="expected a URI string"):
        parse_uri(42)  # type: ignore[arg-type]


def test_join_key() -> None:
    assert join_key("", "a") == "a"
    assert join_key("p", "a") == "p/a"
    assert join_key("p/", "/a") == "p/a"


def test_storage_error_is_root_of_backend_errors() -> None:
    assert issubclass(ThrottledError, StorageError)
