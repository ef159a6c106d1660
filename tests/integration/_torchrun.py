"""Launch a worker script on several ranks with torchrun and read what each rank wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def torchrun(
    worker: Path, *args: str, out: Path, nproc: int = 2, timeout: float = 240
) -> list[Any]:
    """Run ``worker`` on ``nproc`` gloo ranks; return each rank's ``out/rank{r}.json``.

    The worker gets ``args`` on its command line and must write its findings
    to ``out/rank{RANK}.json``. A failing rank fails the test with the tail of
    both output streams.
    """
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(nproc),
            str(worker),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
