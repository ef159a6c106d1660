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

import os

# gRPC's own fork handlers (on by default in its core) stop and restart its
# threads around a fork; with a call in flight on this library's loop thread
# they are skipped, and a forked child then crashed in them (SIGSEGV inside
# os.fork, about one fork in three once other gRPC stores had run in the
# process). A child forked after gRPC was used never uses gRPC here (it reads
# over the JSON API: _grpc_wire.inherited()), so they buy nothing. Off unless
# the user set them. This must precede gRPC's first import to count, and the
# gRPC path (_grpc_wire) is imported only once a store takes it: so here, as
# the backend is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from torchbucket.storage.gcs._store import GCSStore
from torchbucket.storage.gcs.config import DEFAULT_ENDPOINT, GCSConfig

__all__ = ["DEFAULT_ENDPOINT", "GCSConfig", "GCSStore"]
