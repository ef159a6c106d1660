from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import textwrap
import traceback

import pytest

from torchbucket import runtime
from torchbucket.storage.memory import MemoryStore


async def _boom() -> None:
    await asyncio.sleep(0)
    raise KeyError("deep inside the loop")


def test_run_returns_results_and_reraises_with_traceback() -> None:
    async def add(a: int, b: int) -> int:
        return a + b

    assert runtime.run(add(2, 3)) == 5
    with pytest.raises(KeyError) as info:
        runtime.run(_boom())
    frames = traceback.extract_tb(info.value.__traceback__)
    assert any(frame.name == "_boom" for frame in frames)


def test_run_from_the_loop_thread_is_refused_not_deadlocked() -> None:
    async def nested() -> None:
        async def inner() -> int:
            return 1

        runtime.run(inner())

    with pytest.raises(RuntimeError, match="own event loop thread"):
        runtime.run(nested())


def test_run_timeout_cancels() -> None:
    with pytest.raises(TimeoutError):
        runtime.run(asyncio.sleep(10), timeout=0.05)


def _read_in_child(store: MemoryStore, queue: mp.Queue[object]) -> None:
    try:
        data = runtime.run(store.get("k"))
        queue.put((os.getpid(), data, id(runtime.get_loop())))
    except Exception as exc:  # report to the parent instead of dying silently
        queue.put(exc)


def test_a_forked_child_gets_a_fresh_loop() -> None:
    store = MemoryStore("runtime-fork")
    runtime.run(store.put("k", b"from the parent"))
    parent_loop = runtime.get_loop()
    ctx = mp.get_context("fork")
    queue: mp.Queue[object] = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(store, queue))
    child.start()
    result = queue.get(timeout=30)
    child.join(30)
    assert child.exitcode == 0
    assert not isinstance(result, Exception), result
    pid, data, _ = result  # type: ignore[misc]
    assert pid != os.getpid()
    assert data == b"from the parent"
    # The parent's loop is untouched by the child.
    assert runtime.get_loop() is parent_loop
    assert runtime.run(store.get("k")) == b"from the parent"


def test_a_store_pickles_as_its_configuration() -> None:
    store = MemoryStore("runtime-pickle")
    runtime.run(store.put("x", b"1"))
    clone = pickle.loads(pickle.dumps(store))
    assert clone.bucket == "runtime-pickle"
    assert runtime.run(clone.get("x")) == b"1"


def test_work_still_in_flight_at_exit_is_cancelled_quietly() -> None:
    # A prefetch window that nobody reads to the end leaves tasks on the loop;
    # at exit they are cancelled and awaited, not reported as destroyed.
    script = textwrap.dedent(
        """
        import asyncio
        from torchbucket import runtime

        async def forever():
            await asyncio.sleep(3600)

        async def start():
            return asyncio.get_running_loop().create_task(forever())

        task = runtime.run(start())
        print("started", flush=True)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "started"
    assert "destroyed" not in result.stderr, result.stderr
