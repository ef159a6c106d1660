"""The demo: its dataset, and whole runs on the emulator as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.emulator
@pytest.mark.slow
def test_quick_demo_trains_resumes_and_leaves_the_bucket_clean(tmp_path: Path) -> None:
    out = tmp_path / "demo-output"
    done = subprocess.run(
        # --compose: the bucket must be left clean of composites too.
        [sys.executable, "-m", "torchbucket", "demo", "--quick", "--compose", "--out", str(out)],
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
    assert summary["requests"]["training"]["A"] > 0  # the composes
    # Counted by the library (the DataLoader workers' reads included), priced.
    totals = summary["request_totals"]["by_class"]
    assert totals["B"] == sum(p["B"] for p in summary["requests"].values())
    assert summary["cost_usd"] > 0
    assert f"estimated cost  ${summary['cost_usd']:.4f} at list prices" in done.stdout
    # Six classes: chance is 1/6. Even the quick run learns something.
    assert summary["final_accuracy"] > 0.25

    stdout = done.stdout
    assert "resuming at epoch 2" in stdout
    assert "0 composed objects, 0 incomplete uploads: clean" in stdout
    figure = out / "demo.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"figure            {figure}" in stdout


@pytest.mark.emulator
@pytest.mark.slow
def test_demo_on_a_given_bucket_reuses_its_dataset(
    emulator: Any, gcs_bucket_factory: Any, tmp_path: Path
) -> None:
    # --bucket takes the endpoint from STORAGE_EMULATOR_HOST, as it would take
    # credentials for real GCS.
    bucket = gcs_bucket_factory(emulator, prefix="demo").bucket
    argv = [
        "demo",
        "--objects",
        "240",
        "--epochs",
        "2",
        "--no-latency",
        "--bucket",
        f"gs://{bucket}/team/",
    ]
    env = {**os.environ, "STORAGE_EMULATOR_HOST": emulator.endpoint}
    outputs = []
    for run in range(2):
        done = subprocess.run(
            [sys.executable, "-m", "torchbucket", *argv, "--out", str(tmp_path / str(run))],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
            env=env,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        outputs.append(done.stdout)
    assert "Uploaded them to" in outputs[0]
    assert (
        f"Reusing the 240 images already under gs://{bucket}/team/shapes-240-seed0/" in outputs[1]
    )
    names = emulator.object_names(bucket)
    assert sum(n.startswith("team/shapes-240-seed0/") for n in names) == 240
    # Each run checkpointed both epochs under its own run folder.
    assert sum(n.startswith("team/checkpoints/") for n in names) == 4
    assert not [n for n in names if n.startswith("dataflux-composed-objects/")]


def test_the_dataset_is_balanced_labelled_by_folder_and_the_same_every_run() -> None:
    from torchbucket.demo._data import CLASSES, decode, generate, label_of

    def draw(seed: int, processes: int) -> dict[str, bytes]:
        chunks = generate({"train": 60, "val": 12}, seed=seed, processes=processes, chunk=25)
        return {name: data for chunk in chunks for name, data in chunk}

    # The same seed draws the same images, in a pool or in this process (a
    # pool of spawned processes costs seconds of imports: one is enough).
    first = draw(0, processes=2)
    assert first == draw(0, processes=1)  # a run with --bucket reuses the last run's images
    assert first != draw(1, processes=1)
    assert len(first) == 72
    train = [n for n in first if n.startswith("train/")]
    labels = [label_of(n) for n in train]
    assert [labels.count(k) for k in range(len(CLASSES))] == [10] * len(CLASSES)
    assert {n.split("/")[-1] for n in train}.isdisjoint(
        n.split("/")[-1] for n in first if n.startswith("val/")
    )
    image = decode(next(iter(first.values())))
    assert tuple(image.shape) == (3, 32, 32)
