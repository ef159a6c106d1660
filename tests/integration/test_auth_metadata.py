"""Real credentials end to end: the GCE/GKE metadata server, served locally.

A fresh Python process finds no key file and no gcloud credentials, so
google-auth's application default credentials ping the metadata server
(``GCE_METADATA_IP``), decide they run on GCE, and fetch tokens from it
(``GCE_METADATA_HOST``); google-auth reads the latter when it is imported,
hence the child process. Nothing of google-auth is mocked. The store is made
with a plain ``GCSConfig()``: ``STORAGE_EMULATOR_HOST`` names the endpoint and
``TORCHBUCKET_GCS_ANONYMOUS=0`` asks for credentials all the same.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchbucket.emulator import Emulator

pytestmark = pytest.mark.emulator

LIFETIME = 2

CHILD = r"""
import json, os, sys, time
from torchbucket import runtime
from torchbucket.storage.gcs import _credentials
from torchbucket.storage.gcs import GCSStore

store = GCSStore(sys.argv[1])
started = time.monotonic()
for i in range(16):  # about 4 s: two token lifetimes and more
    data = os.urandom(1000 + i)
    runtime.run(store.put(f"m/{i}", data))
    assert runtime.run(store.get(f"m/{i}")) == data, i
    time.sleep(0.25)
names = [info.name for info in runtime.run(store.list_page("m/")).objects]
assert len(names) == 16, names
creds = _credentials._shared_credentials[(False, None)]._credentials
runtime.run(store.close())
print(json.dumps({
    "pid": os.getpid(),
    "seconds": time.monotonic() - started,
    "credentials": type(creds).__module__ + "." + type(creds).__name__,
}))
"""


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator(auth=True, token_lifetime=LIFETIME) as emu:
        yield emu


def test_tokens_from_the_metadata_server_over_several_lifetimes(
    emu: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = f"md-{uuid.uuid4().hex[:12]}"
    emu.create_bucket(bucket)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GOOGLE_APPLICATION_CREDENTIALS", "NO_GCE_CHECK")
    }
    env.update(emu.metadata_env())
    env.update(
        STORAGE_EMULATOR_HOST=emu.endpoint,
        TORCHBUCKET_GCS_ANONYMOUS="0",
        CLOUDSDK_CONFIG=str(tmp_path / "no-gcloud"),  # no gcloud user credentials
    )
    emu.reset_auth_stats()
    done = subprocess.run(
        [sys.executable, str(script), bucket], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["credentials"] == "google.auth.compute_engine.credentials.Credentials"
    stats = emu.auth_stats()
    requests = stats["token_requests"]
    with capsys.disabled():
        print(f"\nmetadata token requests in {result['seconds']:.1f} s: {requests}")
    assert set(requests) == {str(result["pid"])}
    count = requests[str(result["pid"])]
    assert 2 <= count <= 2 + math.ceil(result["seconds"] / (LIFETIME / 2))
    assert stats["rejected"].get("missing", 0) == 0
    assert stats["accepted"] >= 33
