"""Where one bucket's resources are on one endpoint: the URLs the operations send to.

The operations (reads, uploads, compose, listing, multipart) build their
requests from :class:`BucketURLs`; the transport only sends them.
"""

from __future__ import annotations

import yarl

from torchbucket.storage.gcs._wire import quote_name

__all__ = ["BucketURLs"]


class BucketURLs:
    """The URLs of bucket ``bucket`` at ``endpoint``, and its ``gs://`` URIs.

    Args:
        endpoint: The base URL of the service (no trailing ``/``).
        bucket: The bucket name.

    Attributes:
        json_base: ``{endpoint}/storage/v1/b/{bucket}``: the JSON API's bucket resource.
        object_base: ``.../storage/v1/b/{bucket}/o/``: object resources, a
            quoted name after it.
        upload_base: The JSON API's upload URL (simple and resumable uploads).
        xml_base: ``{endpoint}/{bucket}``: the XML API, path style (multipart uploads).
    """

    __slots__ = (
        "_authority",
        "_object_path",
        "_scheme",
        "_uri_prefix",
        "json_base",
        "object_base",
        "upload_base",
        "xml_base",
    )

    def __init__(self, endpoint: str, bucket: str) -> None:
        b = quote_name(bucket)
        self._uri_prefix = f"gs://{bucket}/"
        self.json_base = f"{endpoint}/storage/v1/b/{b}"
        self.object_base = f"{endpoint}/storage/v1/b/{b}/o/"
        self.upload_base = f"{endpoint}/upload/storage/v1/b/{b}/o"
        self.xml_base = f"{endpoint}/{b}"
        parsed = yarl.URL(endpoint)
        self._scheme = parsed.scheme
        self._authority = parsed.raw_authority
        self._object_path = f"{parsed.raw_path.rstrip('/')}/storage/v1/b/{b}/o/"

    def uri(self, key: str = "") -> str:
        """``gs://bucket/key``, for messages."""
        return self._uri_prefix + key

    def object_url(self, key: str, query: str = "") -> yarl.URL:
        """The JSON API URL of object ``key``, with ``query`` (already encoded)."""
        # URL.build from parts costs a third of parsing a whole URL string.
        return yarl.URL.build(
            scheme=self._scheme,
            authority=self._authority,
            path=self._object_path + quote_name(key),
            query_string=query,
            encoded=True,
        )
