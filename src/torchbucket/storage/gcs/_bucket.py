"""Requests about the bucket of the GCS store: list pages, the bucket's metadata, creating it."""

from __future__ import annotations

import json
import os

import yarl

from torchbucket.errors import BucketExistsError, ConfigError, RetryableError
from torchbucket.storage._common import check_page_size
from torchbucket.storage.base import ListPage
from torchbucket.storage.gcs import _errors
from torchbucket.storage.gcs._transport import GCSTransport
from torchbucket.storage.gcs._wire import INFO_FIELDS, object_infos, quote_name

__all__ = [
    "FOLDER_FIELDS",
    "LIST_FIELDS",
    "bucket_exists",
    "create_bucket",
    "list_page",
    "soft_delete_retention",
]

#: The fields of a page of ``objects.list``.
LIST_FIELDS = f"items({INFO_FIELDS}),nextPageToken"
#: The same with the folders (``prefixes``) of a listing with a delimiter.
FOLDER_FIELDS = f"items({INFO_FIELDS}),prefixes,nextPageToken"

# (endpoint, bucket) -> soft-delete retention (see soft_delete_retention).
_soft_delete_cache: dict[tuple[str, str], int | None] = {}


def _page(body: bytes) -> ListPage:
    doc = json.loads(body)
    return ListPage(
        object_infos(doc.get("items", ())),
        doc.get("nextPageToken") or None,
        sorted(doc.get("prefixes", ())),
    )


async def list_page(
    transport: GCSTransport,
    prefix: str,
    fields: str,
    page_token: str | None,
    page_size: int,
    **params: str | None,
) -> ListPage:
    """One page of ``objects.list``, with ``params`` added where set."""
    check_page_size(page_size)
    query = f"maxResults={page_size}&fields={quote_name(fields)}"
    for name, value in {"prefix": prefix, **params, "pageToken": page_token}.items():
        if value:
            query += f"&{name}=" + quote_name(value)
    url = yarl.URL(f"{transport.urls.json_base}/o?{query}", encoded=True)
    uri = transport.urls.uri(prefix)

    async def attempt() -> ListPage:
        _, _, body = await transport.request("GET", url, operation="list", uri=uri, bucket_op=True)
        return _errors.parse_body(_page, body, operation="list", uri=uri)

    return await transport.call(attempt, "list", uri)


async def bucket_exists(transport: GCSTransport) -> bool | None:
    """Whether the bucket exists, asked of the bucket itself (``buckets.get``).

    Returns:
        ``True`` or ``False``; ``None`` when the credentials may not read the
        bucket's metadata (403: ``storage.buckets.get`` is in none of the
        object roles), so a bucket request cannot tell.
    """
    url = yarl.URL(f"{transport.urls.json_base}?fields=name", encoded=True)
    uri = transport.urls.uri()

    async def attempt() -> bool | None:
        status, _, _ = await transport.request(
            "GET", url, operation="bucket get", uri=uri, allow=(403, 404)
        )
        return {403: None, 404: False}.get(status, True)

    return await transport.call(attempt, "bucket get", uri)


async def soft_delete_retention(transport: GCSTransport) -> int | None:
    """Seconds the bucket keeps deleted objects (its soft-delete policy); 0 if none.

    One bucket metadata request (``buckets.get``, class B) per process and
    bucket; the answer is kept for the process's life.

    Returns:
        The retention in seconds, 0 when soft delete is off, or ``None``
        when the credentials may not read the bucket's metadata (403).

    Raises:
        BucketNotFoundError: The bucket does not exist.
    """
    key = (transport.endpoint, transport.bucket)
    if key in _soft_delete_cache:
        return _soft_delete_cache[key]
    url = yarl.URL(f"{transport.urls.json_base}?fields=softDeletePolicy", encoded=True)
    uri = transport.urls.uri()

    async def attempt() -> int | None:
        status, _, body = await transport.request(
            "GET", url, operation="bucket get", uri=uri, allow=(403,), bucket_op=True
        )
        if status == 403:
            return None
        doc = _errors.parse_json(body, operation="bucket get", uri=uri)
        policy = doc.get("softDeletePolicy") or {}
        try:
            return int(policy.get("retentionDurationSeconds") or 0)
        except (TypeError, ValueError):
            return None

    seconds = await transport.call(attempt, "bucket get", uri)
    _soft_delete_cache[key] = seconds
    return seconds


#: Where the project of a new bucket is looked up, after the argument and
#: ``GCSConfig.project``: the variables Google's client libraries and gcloud read.
PROJECT_VARIABLES = ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "GCLOUD_PROJECT")
#: The project sent to an endpoint that is not Google's (emulators take any).
_EMULATOR_PROJECT = "test-project"


def _project_for(transport: GCSTransport, project: str | None, google: bool) -> str:
    for value in (project, transport.project, *map(os.environ.get, PROJECT_VARIABLES)):
        if value:
            return value
    if not google:
        return _EMULATOR_PROJECT
    raise ConfigError(
        f"creating {transport.urls.uri()} needs the project that will own it: pass it "
        f"(torchbucket mb -p PROJECT, GCSConfig(project=...)) or set {PROJECT_VARIABLES[0]}"
    )


async def create_bucket(
    transport: GCSTransport, *, project: str | None = None, location: str | None = None
) -> None:
    """Create the bucket (``buckets.insert``: a class A request).

    Args:
        transport: The store's transport (its bucket is the one created).
        project: The project that owns it; default ``GCSConfig.project``, else
            ``$GOOGLE_CLOUD_PROJECT`` (or gcloud's variables); required on
            Google's endpoint, any on an emulator.
        location: A GCS location (``US``, ``europe-west4``...); default GCS's (``US``).

    Raises:
        BucketExistsError: It exists (HTTP 409): yours, or a name taken by anyone.
        ConfigError: No project is known for Google's endpoint.
    """
    host = yarl.URL(transport.endpoint).host or ""
    google = host == "googleapis.com" or host.endswith(".googleapis.com")
    query = "project=" + quote_name(_project_for(transport, project, google))
    url = yarl.URL(f"{transport.endpoint}/storage/v1/b?{query}", encoded=True)
    resource: dict[str, str] = {"name": transport.bucket}
    if location:
        resource["location"] = location
    body = json.dumps(resource).encode()
    uri = transport.urls.uri()
    ambiguous = False

    async def attempt() -> None:
        nonlocal ambiguous
        try:
            status, _, answer = await transport.request(
                "POST",
                url,
                operation="create bucket",
                uri=uri,
                headers={"Content-Type": "application/json"},
                data=body,
                allow=(409,),
            )
        except RetryableError:
            ambiguous = True
            raise
        if status == 409 and not ambiguous:
            _, message = _errors.error_code(answer)
            raise BucketExistsError(
                message or "bucket already exists", operation="create bucket", uri=uri, status=409
            )
        # A 409 after an attempt whose answer was lost: that attempt created it.

    await transport.call(attempt, "create bucket", uri)
