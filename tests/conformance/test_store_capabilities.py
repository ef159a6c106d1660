"""The optional protocols of ``storage.capabilities``: claimed exactly, honoured where claimed.

Code above the seam reaches a store's optional features only through
``isinstance`` on these protocols, so a backend that claims one it does not
honour (or honours one it does not claim) changes what users get. Each backend
claims exactly the protocols in ``CLAIMS``; each protocol runs on every backend
that claims it and is not collected for the others (tests/conformance/conftest.py).
"""

from __future__ import annotations

import time
import uuid

import pytest

from torchbucket.config import RetryConfig
from torchbucket.errors import NotFoundError
from torchbucket.storage import (
    RemoteStore,
    SupportsBucketInfo,
    SupportsCreationTime,
    SupportsSoftDelete,
    SupportsZonal,
    UncheckedMultipartAssembly,
)
from torchbucket.storage.gcs import GCSStore

from .conftest import CLAIMS, GCS_CLAIMS, SyncStore

PROTOCOLS = sorted(GCS_CLAIMS, key=lambda p: p.__name__)


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_backend_claims_exactly_its_protocols(s: SyncStore, protocol: type) -> None:
    assert isinstance(s.store, protocol) == (protocol in CLAIMS[s.backend])


@pytest.mark.capability.with_args(SupportsBucketInfo)
def test_bucket_exists_tells_a_bucket_from_a_missing_one(s: SyncStore) -> None:
    assert isinstance(s.store, SupportsBucketInfo)
    assert s.run(s.store.bucket_exists()) is True
    assert isinstance(s.store, GCSStore)  # the one backend that claims it
    missing = GCSStore(f"missing-{uuid.uuid4().hex[:12]}", config=s.store.config)
    try:
        assert s.run(missing.bucket_exists()) is False
    finally:
        s.run(missing.close())


@pytest.mark.capability.with_args(SupportsSoftDelete)
def test_soft_delete_retention_is_seconds(s: SyncStore) -> None:
    assert isinstance(s.store, SupportsSoftDelete)
    # A fresh emulator bucket keeps nothing (GCS's 7-day default is not modelled
    # on creation through the admin API).
    assert s.run(s.store.soft_delete_retention()) == 0


@pytest.mark.capability.with_args(SupportsCreationTime)
def test_created_is_when_the_object_was_written(s: SyncStore) -> None:
    assert isinstance(s.store, SupportsCreationTime)
    before = time.time()
    info = s.put("made", b"x")
    stamp = s.run(s.store.created(s.k("made")))
    assert stamp is not None
    assert before - 60 <= stamp <= time.time() + 60  # the server's clock, to a minute
    assert s.run(s.store.created(s.k("made"), generation=info.generation)) == stamp
    with pytest.raises(NotFoundError):
        s.run(s.store.created(s.k("never-written")))


@pytest.mark.capability.with_args(UncheckedMultipartAssembly)
def test_unchecked_assembly_says_so(s: SyncStore) -> None:
    assert isinstance(s.store, UncheckedMultipartAssembly)
    assert s.store.unchecked_multipart_assembly is True


@pytest.mark.capability.with_args(RemoteStore)
def test_remote_store_names_its_endpoint_and_retries(s: SyncStore) -> None:
    assert isinstance(s.store, RemoteStore)
    assert s.emulator is not None
    assert s.store.endpoint == s.emulator.endpoint
    assert isinstance(s.store.retry, RetryConfig)


@pytest.mark.capability.with_args(SupportsZonal)
def test_an_emulator_bucket_is_not_zonal(s: SyncStore) -> None:
    assert isinstance(s.store, SupportsZonal)
    assert s.run(s.store.zonal()) is False
    assert s.run(s.store.zonal_orphans()) == []  # no data objects: one listing
