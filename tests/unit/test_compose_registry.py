"""The registry deletes composites left in flight at exit, on SIGTERM, and in workers."""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchbucket import runtime
from torchbucket.compose.registry import in_flight, register
from torchbucket.storage.local import LocalStore

_PRELUDE = """
import os, signal, sys
from torchbucket import runtime
from torchbucket.compose.registry import register, install_sigterm_handler
from torchbucket.storage.local import LocalStore
store = LocalStore()
key = sys.argv[1].lstrip("/")
runtime.run(store.put(key, b"composite"))
register(store, key)
"""


def _run(script: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_composite_in_flight_at_exit_is_deleted(tmp_path: Path) -> None:
    target = tmp_path / "composite"
    result = _run(_PRELUDE + "assert os.path.exists(sys.argv[1])\n", target)
    assert result.returncode == 0, result.stderr
    assert not target.exists()


def test_sigterm_deletes_then_chains_to_the_previous_handler(tmp_path: Path) -> None:
    target = tmp_path / "composite"
    marker = tmp_path / "previous-ran"
    script = f"""
import os, signal
def previous(signum, frame):
    open({str(marker)!r}, "w").write(str(os.path.exists({str(target)!r})))
    os._exit(3)
signal.signal(signal.SIGTERM, previous)
{_PRELUDE}
assert install_sigterm_handler()
assert install_sigterm_handler()  # once only: a second call changes nothing
os.kill(os.getpid(), signal.SIGTERM)
"""
    result = _run(script, target)
    assert result.returncode == 3, result.stderr
    assert marker.read_text() == "False"  # deleted before the previous handler ran
    assert not target.exists()


def test_sigterm_with_default_handler_still_ends_the_process(tmp_path: Path) -> None:
    target = tmp_path / "composite"
    script = (
        _PRELUDE
        + """
assert install_sigterm_handler()
os.kill(os.getpid(), signal.SIGTERM)
import time; time.sleep(30)
"""
    )
    result = _run(script, target)
    assert result.returncode == -signal.SIGTERM
    assert not target.exists()


def _child(path: str) -> None:
    store = LocalStore()
    key = path.lstrip("/")
    runtime.run(store.put(key, b"composite"))
    register(store, key)
    # returns; multiprocessing then ends the process with os._exit


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_process_deletes_its_composites_before_os_exit(tmp_path: Path, method: str) -> None:
    target = tmp_path / "composite"
    process = multiprocessing.get_context(method).Process(target=_child, args=(str(target),))
    process.start()
    process.join(60)
    assert process.exitcode == 0
    assert not target.exists()


def test_forked_child_does_not_delete_its_parents_composites(tmp_path: Path) -> None:
    target = tmp_path / "parent-composite"
    store = LocalStore()
    key = str(target).lstrip("/")
    runtime.run(store.put(key, b"composite"))
    register(store, key)
    try:
        process = multiprocessing.get_context("fork").Process(target=lambda: None)
        process.start()
        process.join(60)
        assert process.exitcode == 0
        assert target.exists()
    finally:
        runtime.run(store.delete(key))
        from torchbucket.compose.registry import unregister

        unregister(store, key)
    assert in_flight() == []
