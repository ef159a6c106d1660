"""Contender processes forked from an interpreter that has done its imports once.

A contender runs in a process of its own so that what is measured is its
alone; a fresh interpreter per run also pays ``import torch`` (2-3 s of one
core on these machines) before every run, outside the measured phase but not
outside the sweep: ``sizes.py --quick`` starts about 100 of them. A zygote is
an interpreter that imports the heavy modules once and forks a child per run;
the child starts a new session, takes the run's files as stdin, stdout and
stderr and the run's environment, and runs the contender script as
``__main__``, as ``python script arg`` would. Each child starts from the same
state (the zygote does nothing between runs but wait), and the measured phase
is the contender's own (``_contenders/_common.py``'s ``Phase``: CPU and wall
from its start to its end), so the figures are those of a fresh process; the
test ``tests/unit/test_bench_zygote.py`` checks what a child sees.

A zygote serves a run only when the run's interpreter is its own and the
run's environment equals the one it started with, except for the variables
named in ``per_run`` (the emulator's address): the rest (``PYTHON*``,
``MALLOC_*``, ``LD_*``, the library's tuning read at import...) is read once
at start or import, and a run that sets it differently gets a fresh process.

Protocol, one JSON line each way on two pipes (not stdin and stdout, which
stay the zygote's own): a request ``{"script", "args", "env", "stdout",
"stderr"}``; the replies ``{"pid"}`` once forked, then ``{"status",
"cpu_s", "maxrss_kb"}`` once the child is reaped (``os.wait4``: its CPU and
that of the children it reaped, its peak RSS).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import select
import subprocess
import sys
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

#: What every contender forked from a zygote imports anyway (the DataLoader),
#: and the seconds of its start: nothing more, so that a child holds no module
#: a fresh interpreter of the same contender would not (torchbucket's import
#: sets an environment variable; gcsfs's reads some).
PRELOAD = ("torch", "torch.utils.data", "numpy")


#: What a contender reads at run time, set by the harness per run: the
#: emulator's address.
PER_RUN = ("STORAGE_EMULATOR_HOST",)


@dataclass
class Exit:
    """A reaped child: exit status (negative: killed by that signal), CPU, peak RSS."""

    status: int
    cpu_s: float
    maxrss_kb: float


def start_env() -> dict[str, str]:
    """The environment a zygote starts with: this process's, unbuffered output."""
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def same_start(env: Mapping[str, str], base: Mapping[str, str], per_run: Iterable[str]) -> bool:
    """Whether ``env`` equals ``base`` but for the ``per_run`` variables."""
    keys = (set(env) | set(base)) - set(per_run)
    return all(env.get(k) == base.get(k) for k in keys)


class Zygote:
    """One interpreter, its imports done, forking a child per contender run.

    Args:
        python: The interpreter.
        preload: Modules to import once (missing ones are skipped).
        per_run: Environment variables a run may set differently from the
            zygote's start (read by the contender at run time, not at start).
    """

    def __init__(
        self,
        python: str,
        preload: Sequence[str] = PRELOAD,
        per_run: Iterable[str] = PER_RUN,
    ) -> None:
        self.python = python
        self.per_run = frozenset(per_run)
        self.env = start_env()
        req_r, self._req = os.pipe()
        self._rep, rep_w = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [python, __file__, str(req_r), str(rep_w), *preload],
                env=self.env,
                pass_fds=(req_r, rep_w),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            for fd in (self._req, self._rep):
                os.close(fd)
            raise
        finally:
            os.close(req_r)
            os.close(rep_w)
        self._buffer = b""
        self._pending: int | None = None
        ready = self._reply(timeout=300.0)
        if ready is None or "ready" not in ready:
            self.close()
            raise RuntimeError(f"zygote for {python} did not start: {ready}")
        self.preloaded: list[str] = ready["ready"]

    def serves(self, python: str | None, env: Mapping[str, str]) -> bool:
        """Whether a run with this interpreter and environment may be forked from here."""
        if python not in (None, self.python) or self._proc.poll() is not None:
            return False
        return same_start(env, self.env, self.per_run)

    def start(self, script: Path, args: Sequence[str], env: Mapping[str, str],
              stdout: Path, stderr: Path) -> int:  # fmt: skip
        """Fork a child that runs ``script args``; its pid (a session leader)."""
        if self._pending is not None:
            raise RuntimeError("one run at a time: the last child is not reaped")
        request = {"script": str(script), "args": list(args), "env": dict(env),
                   "stdout": str(stdout), "stderr": str(stderr)}  # fmt: skip
        os.write(self._req, json.dumps(request).encode() + b"\n")
        reply = self._reply(timeout=60.0)
        if reply is None or "pid" not in reply:
            raise RuntimeError(f"zygote for {self.python} did not fork: {reply}")
        self._pending = int(reply["pid"])
        return self._pending

    def wait(self, timeout: float | None) -> Exit | None:
        """The last child's exit, or ``None`` when it still runs after ``timeout`` s."""
        reply = self._reply(timeout)
        if reply is None:
            return None
        if "status" not in reply:
            raise RuntimeError(f"zygote for {self.python} lost its child: {reply}")
        self._pending = None
        return Exit(int(reply["status"]), float(reply["cpu_s"]), float(reply["maxrss_kb"]))

    def _reply(self, timeout: float | None) -> dict[str, Any] | None:
        """The next reply line, or ``None`` after ``timeout`` s without one.

        Read from the descriptor into a buffer of its own: a buffered file
        could hold a second reply (a child that ended at once) where
        ``select`` no longer sees it.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._rep], [], [], left)
            if not ready:
                return None
            chunk = os.read(self._rep, 1 << 16)
            if not chunk:
                return {"eof": self._proc.poll()}
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        """Stop the zygote (a child still running is the caller's to kill)."""
        for fd in (self._req, self._rep):
            with contextlib.suppress(OSError):
                os.close(fd)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Zygotes:
    """A zygote per interpreter, started on first use; :meth:`close` stops them all."""

    def __init__(
        self,
        preload: Sequence[str] = PRELOAD,
        per_run: Iterable[str] = PER_RUN,
    ) -> None:
        self.preload = preload
        self.per_run = frozenset(per_run)
        self._by_python: dict[str, Zygote] = {}

    def get(self, python: str | None, env: Mapping[str, str]) -> Zygote | None:
        """The zygote that serves a run of ``python`` (``None``: this one) with ``env``.

        ``None`` (a fresh process, then) for an environment a zygote started
        now would not have: none is started for it.
        """
        python = python or sys.executable
        zygote = self._by_python.get(python)
        if zygote is None:
            if not same_start(env, start_env(), self.per_run):
                return None
            zygote = self._by_python[python] = Zygote(python, self.preload, self.per_run)
        return zygote if zygote.serves(python, env) else None

    def close(self) -> None:
        for zygote in self._by_python.values():
            zygote.close()
        self._by_python.clear()

    def __enter__(self) -> Zygotes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- the zygote side


def _run_child(request: dict[str, Any], control: Sequence[int], added: dict[str, str]) -> None:
    """In the forked child: become ``python script args`` with the run's files and environment."""
    status = 1
    try:
        os.setsid()
        for fd in control:
            os.close(fd)
        for fd, path, flags in (
            (0, os.devnull, os.O_RDONLY),
            (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            opened = os.open(path, flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        # What the preloaded imports set (setdefault) a fresh interpreter sets too.
        os.environ.clear()
        os.environ.update({**added, **request["env"]})
        script = os.path.abspath(request["script"])
        sys.argv = [script, *request["args"]]
        sys.path[0] = os.path.dirname(script)
        try:
            runpy.run_path(script, run_name="__main__")
            status = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                status = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        atexit._run_exitfuncs()  # as at a normal interpreter exit (DataLoader, multiprocessing)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def _serve(requests: BinaryIO, replies: BinaryIO, preload: Sequence[str]) -> None:
    before = dict(os.environ)
    loaded = []
    for name in preload:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
            loaded.append(name)
    added = {k: v for k, v in os.environ.items() if before.get(k) != v}

    def reply(payload: dict[str, Any]) -> None:
        replies.write(json.dumps(payload).encode() + b"\n")
        replies.flush()

    reply({"ready": loaded})
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_child(request, (requests.fileno(), replies.fileno()), added)
        reply({"pid": pid})
        _, status, usage = os.wait4(pid, 0)
        reply({
            "status": os.waitstatus_to_exitcode(status),
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "maxrss_kb": usage.ru_maxrss,
        })  # fmt: skip


if __name__ == "__main__":
    _serve(os.fdopen(int(sys.argv[1]), "rb"), os.fdopen(int(sys.argv[2]), "wb"), sys.argv[3:])
