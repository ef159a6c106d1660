"""Run one page's code blocks in order (see test_docs_snippets.py).

    python _docs_driver.py PLAN.json

PLAN holds the page's name, whether its python blocks run alone, and its
blocks. Bash blocks run in a shell of their own (in a session of their own,
ended at the end, with whatever they left running); what they export carries
on to the next blocks. After a block that leaves a job in the background, the
driver waits until ``$STORAGE_EMULATOR_HOST`` accepts connections.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any
from urllib.parse import urlsplit


def _commands(block: dict[str, Any]) -> str:
    if block["lang"] != "console":
        return str(block["code"])
    lines = [ln[2:] for ln in str(block["code"]).splitlines() if ln.startswith("$ ")]
    return "\n".join(lines) + "\n"


def _wait_for_endpoint(deadline: float = 60.0) -> None:
    host = os.environ.get("STORAGE_EMULATOR_HOST")
    if not host:
        return
    url = urlsplit(host if "://" in host else f"http://{host}")
    until = time.monotonic() + deadline
    while True:
        try:
            with socket.create_connection((url.hostname or "127.0.0.1", url.port or 80), 1):
                return
        except OSError:
            if time.monotonic() > until:
                raise
            time.sleep(0.1)


def _run_shell(block: dict[str, Any], groups: list[int]) -> None:
    with tempfile.NamedTemporaryFile(suffix=".env", delete=False) as f:
        env_file = f.name
    script = f"set -euo pipefail\n{_commands(block)}\nenv -0 > {env_file}\n"
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    groups.append(proc.pid)
    rc = proc.wait()
    if rc != 0:
        raise SystemExit(f"block at line {block['line']} exited {rc}")
    with open(env_file, "rb") as f:
        exported = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    os.unlink(env_file)
    for key, value in exported.items():
        name = key.decode()
        if name not in {"SHLVL", "_", "PWD", "OLDPWD"}:
            os.environ[name] = value.decode()
    if any(ln.rstrip().endswith("&") for ln in _commands(block).splitlines()):
        _wait_for_endpoint()


def main() -> int:
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    shared: dict[str, Any] = {"__name__": "__main__"}
    groups: list[int] = []
    try:
        for block in plan["blocks"]:
            where = f"{plan['page']}:{block['line']}"
            print(f"--- {where} ({block['lang']})", flush=True)
            started = time.monotonic()
            if block["lang"] == "python":
                namespace = {"__name__": "__main__"} if plan["isolated"] else shared
                exec(compile(block["code"], where, "exec"), namespace)
            else:
                _run_shell(block, groups)
            print(f"--- {where}: {time.monotonic() - started:.1f} s", flush=True)
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
