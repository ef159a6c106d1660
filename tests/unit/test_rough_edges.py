"""Rough edges a first-time user met (issue 39), each with what they see now."""

from __future__ import annotations

import json

from torchbucket.errors import BucketNotFoundError
from torchbucket.storage.gcs._errors import error_for_response


def test_a_missing_bucket_is_said_once() -> None:
    # GCS's own answer to a listing of a bucket that does not exist.
    body = json.dumps(
        {
            "error": {
                "code": 404,
                "message": "The specified bucket my-bucket does not exist.",
                "errors": [{"reason": "notFound"}],
            }
        }
    ).encode()
    error = error_for_response(
        404, {}, body, operation="list", uri="gs://my-bucket/", bucket_op=True
    )
    assert isinstance(error, BucketNotFoundError)
    assert (
        str(error)
        == "list gs://my-bucket/: The specified bucket my-bucket does not exist. (HTTP 404)"
    )
    assert str(error).lower().count("does not exist") == 1
