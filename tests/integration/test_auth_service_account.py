"""Real credentials end to end: a service-account key file through google-auth.

Nothing of google-auth is mocked: ``GOOGLE_APPLICATION_CREDENTIALS`` names a
key file the emulator generated, google-auth signs its JWT and asks the
emulator's token endpoint for tokens, and the emulator refuses every GCS
request without a valid one. Tokens live a second or two, so a DataLoader
epoch or a checkpoint save and load outlives several of them.
"""

from __future__ import annotations

import math
import os
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from torchbucket import runtime
from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.config import RetryConfig
from torchbucket.datasets import BucketMapDataset
from torchbucket.emulator import Emulator, LatencyModel
from torchbucket.errors import PermissionDeniedError
from torchbucket.storage.gcs import GCSConfig, GCSStore, _credentials

pytestmark = pytest.mark.emulator

LIFETIME = 1  # seconds each token lives
RETRY = RetryConfig(
    initial_backoff=0.01, max_backoff=0.05, deadline=30.0, attempt_timeout=10.0, read_timeout=5.0
)
N = 48
SAMPLE_SECONDS = 0.125  # per sample in data_format_fn: an epoch of about 3 s


def payload(i: int) -> bytes:
    return f"{i:05d}".encode() * 200


def slow_sample(data: bytes) -> tuple[int, bytes]:
    time.sleep(SAMPLE_SECONDS)
    return os.getpid(), bytes(data)


def as_list(batch: list[Any]) -> list[Any]:
    return list(batch)


@pytest.fixture(scope="module")
def short_tokens() -> Iterator[Emulator]:
    with Emulator(auth=True, token_lifetime=LIFETIME) as emu:
        yield emu


@pytest.fixture(scope="module")
def long_tokens() -> Iterator[Emulator]:
    with Emulator(auth=True, token_lifetime=3600) as emu:
        yield emu


def _use_key(emu: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A fresh key file in GOOGLE_APPLICATION_CREDENTIALS, and a fresh token cache."""
    key = emu.service_account_key(tmp_path / "key.json")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", key["path"])
    monkeypatch.delenv("TORCHBUCKET_GCS_ANONYMOUS", raising=False)
    monkeypatch.setattr(_credentials, "_shared_credentials", {})
    emu.reset_auth_stats()
    return key


def _config(emu: Emulator, **kw: Any) -> GCSConfig:
    return GCSConfig(endpoint=emu.endpoint, anonymous=False, retry=RETRY, **kw)


def _bucket(emu: Emulator) -> str:
    name = f"auth-{uuid.uuid4().hex[:12]}"
    emu.create_bucket(name)
    return name


def _bound(elapsed: float) -> int:
    """Token requests a process may make in ``elapsed`` seconds: about one per
    three quarters of a lifetime, and one after each 401; at most one per half
    lifetime on average, plus two."""
    return 2 + math.ceil(elapsed / (LIFETIME / 2))


def test_an_expired_token_is_refreshed_once_and_the_request_sent_again(
    long_tokens: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emu = long_tokens
    _use_key(emu, tmp_path, monkeypatch)
    bucket = _bucket(emu)
    emu.seed(bucket, {"k": b"payload"})
    store = GCSStore(bucket, config=_config(emu))
    try:
        assert runtime.run(store.get("k")) == b"payload"
        assert emu.expire_tokens() == 1  # the server's clock says it is over
        assert runtime.run(store.get("k")) == b"payload"
    finally:
        runtime.run(store.close())
    stats = emu.auth_stats()
    assert stats["rejected"] == {"expired": 1}
    assert stats["token_requests"] == {str(os.getpid()): 2}  # the first, and one refresh


def test_a_revoked_key_fails_at_once_naming_the_uri_never_the_token(
    long_tokens: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emu = long_tokens
    key = _use_key(emu, tmp_path, monkeypatch)
    bucket = _bucket(emu)
    emu.seed(bucket, {"k": b"payload"})
    store = GCSStore(bucket, config=_config(emu))
    try:
        assert runtime.run(store.get("k")) == b"payload"
        token = _credentials._shared_credentials[(False, None)]._state[0]["Authorization"]
        assert emu.revoke_key(key["private_key_id"]) == 1
        with pytest.raises(PermissionDeniedError) as info:
            runtime.run(store.get("k"))
    finally:
        runtime.run(store.close())
    message = str(info.value)
    assert f"gs://{bucket}/k" in message
    assert "invalid_grant" in message
    text = "".join(traceback.format_exception(info.value))
    assert token.split()[1] not in text and "ya29." not in text
    stats = emu.auth_stats()
    assert stats["rejected"] == {"revoked": 1}  # one request, not a retry loop
    assert stats["grants_refused"] == {"invalid_grant": 1}
    assert stats["token_requests"] == {str(os.getpid()): 2}


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_an_epoch_over_several_token_lifetimes_reads_exact_bytes(
    short_tokens: Emulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    context: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    emu = short_tokens
    _use_key(emu, tmp_path, monkeypatch)
    bucket = _bucket(emu)
    emu.seed(bucket, {f"train/{i:05d}": payload(i) for i in range(N)})
    started = time.monotonic()
    ds = BucketMapDataset.from_prefix(
        f"gs://{bucket}/train/", gcs=_config(emu), data_format_fn=slow_sample
    )
    # A sampler the dataset does not read ahead of (a plain range): each
    # worker's reads spread over the whole epoch, across token lifetimes.
    loader = DataLoader(
        ds,
        batch_size=4,
        sampler=range(N),
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=as_list,
    )
    seen = [sample for batch in loader for sample in batch]
    elapsed = time.monotonic() - started
    assert sorted(data for _, data in seen) == sorted(payload(i) for i in range(N))
    workers = {pid for pid, _ in seen}
    assert len(workers) == 2
    per_process = emu.auth_stats()["token_requests"]
    with capsys.disabled():  # the figure the issue asks to report (seen with -s)
        print(f"\ntoken requests per process in {elapsed:.1f} s: {per_process}")
    # Each worker fetched tokens of its own once its first one ran out.
    assert workers <= {int(pid) for pid in per_process}
    assert max(per_process.values()) <= _bound(elapsed), (per_process, elapsed)
    assert set(per_process) <= {str(os.getpid())} | {str(pid) for pid in workers}


@pytest.mark.parametrize("upload_method", ["multipart", "resumable"])
def test_a_checkpoint_saved_and_loaded_over_several_token_lifetimes(
    short_tokens: Emulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    upload_method: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    emu = short_tokens
    _use_key(emu, tmp_path, monkeypatch)
    bucket = _bucket(emu)
    part = 256 * 1024
    checkpoint = BucketCheckpoint(
        config=CheckpointConfig(
            part_size=part,
            min_part_size=part,
            parts_in_flight=2,
            upload_method=upload_method,  # type: ignore[arg-type]
            range_size=part,
            reads_in_flight=2,
        ),
        gcs=_config(emu, upload_chunk_size=part, max_simple_upload_size=part),
    )
    state = {"w": torch.arange(1 << 20, dtype=torch.float32)}  # 4 MiB: 16 parts
    uri = f"gs://{bucket}/ck/step-1.pt"
    emu.set_latency(LatencyModel(read=0.15, list_page=0.05, write=0.15, bandwidth=None))
    started = time.monotonic()
    try:
        checkpoint.save(state, uri)
        loaded = checkpoint.load(uri, weights_only=True)
    finally:
        emu.set_latency(None)
    elapsed = time.monotonic() - started
    assert torch.equal(loaded["w"], state["w"])
    per_process = emu.auth_stats()["token_requests"]
    with capsys.disabled():  # the figure the issue asks to report (seen with -s)
        print(f"\ntoken requests per process in {elapsed:.1f} s: {per_process}")
    assert elapsed > 2 * LIFETIME, "the save and load should outlive several tokens"
    assert per_process[str(os.getpid())] <= _bound(elapsed), (per_process, elapsed)
    assert per_process[str(os.getpid())] >= 2


def test_a_zonal_checkpoint_over_grpc_carries_fresh_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The gRPC path's credentials: each stream's metadata carries the token
    # the JSON path would send, refreshed as it expires; the emulator refuses a
    # stream without a valid one (UNAUTHENTICATED).
    with Emulator(auth=True, token_lifetime=LIFETIME, grpc=True) as emu:
        assert emu.grpc_endpoint is not None
        _use_key(emu, tmp_path, monkeypatch)
        bucket = f"authz-{uuid.uuid4().hex[:12]}"
        emu.create_bucket(bucket, zonal=True)
        checkpoint = BucketCheckpoint(
            config=CheckpointConfig(range_size=256 * 1024, reads_in_flight=2),
            gcs=_config(emu, grpc_endpoint=f"http://{emu.grpc_endpoint}"),
        )
        state = {"w": torch.arange(1 << 20, dtype=torch.float32)}  # 4 MiB: streamed
        uri = f"gs://{bucket}/ck/step-1.pt"
        emu.set_latency(LatencyModel(read=0.15, list_page=0.05, write=0.15, bandwidth=None))
        started = time.monotonic()
        checkpoint.save(state, uri)
        loaded = checkpoint.load(uri, weights_only=True)
        elapsed = time.monotonic() - started
        assert torch.equal(loaded["w"], state["w"])
        assert emu.stats().get("by_rpc", {}).get("BidiWriteObject", 0) >= 1
        assert emu.stats().get("by_rpc", {}).get("BidiReadObject", 0) >= 1
        per_process = emu.auth_stats()["token_requests"][str(os.getpid())]
        assert elapsed > 2 * LIFETIME, "the save and load should outlive several tokens"
        assert 2 <= per_process <= _bound(elapsed), (per_process, elapsed)
