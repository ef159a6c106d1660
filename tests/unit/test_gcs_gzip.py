"""Decoding of gzip-encoded objects, and their encodings kept through a listing's columns."""

from __future__ import annotations

import gzip

import pytest

from torchbucket.errors import IntegrityError, StorageError
from torchbucket.listing._columns import decode_objects, encode_objects
from torchbucket.storage.base import ObjectInfo
from torchbucket.storage.gcs._gzip import GzipDecoder, gunzip
from torchbucket.storage.gcs._wire import object_info, verify_crc32c

URI = "gs://b/o.gz"


def test_members_back_to_back_decode_to_their_concatenation_in_any_chunking() -> None:
    stored = gzip.compress(b"first " * 1000) + gzip.compress(b"second " * 1000)
    assert gunzip(stored, URI) == b"first " * 1000 + b"second " * 1000
    for step in (1, 7, 4096):
        decoder = GzipDecoder(URI)
        out = b"".join(decoder.feed(stored[i : i + step]) for i in range(0, len(stored), step))
        assert out + decoder.finish() == b"first " * 1000 + b"second " * 1000


# mtime=0: the same bytes in every process that collects the tests (pytest-xdist).
@pytest.mark.parametrize(
    "stored", [b"not gzip at all", gzip.compress(b"x" * 100, mtime=0)[:-9]], ids=["plain", "cut"]
)
def test_bytes_that_do_not_decode_are_an_error_naming_the_object(stored: bytes) -> None:
    with pytest.raises(StorageError) as caught:
        gunzip(stored, URI)
    assert URI in str(caught.value)
    assert "Content-Encoding: gzip" in str(caught.value)


def test_a_server_decoded_answer_is_not_checked_against_the_stored_hash() -> None:
    decoded = {"x-goog-hash": "crc32c=AAAAAA==", "x-goog-stored-content-encoding": "gzip"}
    verify_crc32c(decoded, "BBBBBB==", URI)  # GCS gives no hash of the decoded bytes
    with pytest.raises(IntegrityError):
        verify_crc32c({**decoded, "Content-Encoding": "gzip"}, "BBBBBB==", URI)


def test_content_encoding_comes_from_the_resource_and_survives_the_columns() -> None:
    gz = object_info({"name": "a", "size": "3", "contentEncoding": "gzip"})
    plain = object_info({"name": "b", "size": "4", "contentEncoding": "identity"})
    assert (gz.content_encoding, gz.transcoded) == ("gzip", True)
    assert (plain.content_encoding, plain.transcoded) == (None, False)
    objects = [gz, plain, ObjectInfo("c", 5, content_encoding="br")]
    assert decode_objects(encode_objects(objects)) == objects
