"""The demo in --quick mode, end to end on its own emulator, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.emulator, pytest.mark.slow]


def test_quick_demo_trains_resumes_and_leaves_the_bucket_clean(tmp_path: Path) -> None:
    out = tmp_path / "demo-output"
    done = subprocess.run(
        [sys.executable, "-m", "torchbucket", "demo", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr

    summary = json.loads((out / "summary.json").read_text())
    epochs = [(r["epoch"], r["job"]) for r in summary["history"]]
    # Job 1 trains epoch 1; the restarted job 2 loads it and trains epoch 2.
    assert epochs == [(1, 1), (2, 2)]
    assert summary["resumed_from_epoch"] == 1
    assert len(summary["checkpoint_uris"]) == 2
    assert summary["composites_left"] == 0
    assert summary["uploads_left"] == 0
    assert summary["objects"] == 1200
    assert summary["requests"]["upload"]["A"] >= 1200
    assert summary["requests"]["training"]["B"] > 0
    # Six classes: chance is 1/6. Even the quick run learns something.
    assert summary["final_accuracy"] > 0.25

    stdout = done.stdout
    assert "resuming at epoch 2" in stdout
    assert "0 composed objects, 0 incomplete uploads: clean" in stdout
    figure = out / "demo.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"figure            {figure}" in stdout
