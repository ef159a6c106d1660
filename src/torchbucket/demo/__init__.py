"""The demo job: train a small CNN on generated images read from a bucket.

``python -m torchbucket demo`` (or ``make demo``) starts a local GCS emulator
with a same-region latency model, uploads a generated dataset of small PNG
files, trains through :class:`~torchbucket.datasets.BucketMapDataset` with a
multi-worker ``DataLoader``, checkpoints every epoch to the bucket, restarts
from the last checkpoint as a new job would, and ends with a summary table and
a figure.
"""

from __future__ import annotations

from torchbucket.demo._job import DemoResult, run_demo
from torchbucket.demo._report import format_summary, write_figure, write_json
from torchbucket.demo.config import DemoConfig

__all__ = ["DemoConfig", "DemoResult", "format_summary", "run_demo", "write_figure", "write_json"]
