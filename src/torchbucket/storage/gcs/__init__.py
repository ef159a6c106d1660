"""The GCS backend: :class:`GCSStore` and its :class:`GCSConfig`.

Layout (each module takes the store's one transport; nothing here imports the
store):

- ``_store``: :class:`GCSStore`, which owns a transport and picks the operation;
- ``_transport``: how one request is sent (session, credentials, limiter,
  retries, the error mapping, the in-place reader), and object metadata;
- ``_session``, ``_credentials``, ``_errors``: aiohttp sessions and TLS trust,
  Google credentials, HTTP answers to :mod:`torchbucket.errors` types;
- ``_reads`` (with ``_gzip``, ``_rawget``, ``_rawconn``): verified reads;
- ``_simple``, ``_resumable``, ``_multipart`` (with ``_xml``): the upload protocols;
- ``_uncertain``: writes whose outcome is uncertain;
- ``_objects``: compose, copy, delete; ``_bucket``: list pages, bucket metadata;
- ``_config``, ``_wire``: the configuration, and pure helpers of the wire format.
"""

from __future__ import annotations

from torchbucket.storage.gcs._store import GCSStore
from torchbucket.storage.gcs.config import DEFAULT_ENDPOINT, GCSConfig

__all__ = ["DEFAULT_ENDPOINT", "GCSConfig", "GCSStore"]
