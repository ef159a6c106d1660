"""The demo job, step by step: data into a bucket, train, checkpoint, restart, evaluate."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import IO, Any, cast

import torch
from torch import nn
from tqdm import tqdm

from torchbucket.checkpoint import BucketCheckpoint
from torchbucket.compose import ComposeConfig
from torchbucket.datasets import BucketMapDataset
from torchbucket.demo._bucket import find_leftovers, list_uris, mib, plural, upload_folder
from torchbucket.demo._data import CLASSES, decode, drawing_processes, generate
from torchbucket.demo._model import SmallCNN
from torchbucket.demo._train import Labelled, evaluate, make_loader, train_epoch
from torchbucket.demo.config import DemoConfig
from torchbucket.runtime import accounting
from torchbucket.runtime.prices import estimate
from torchbucket.storage import HIDDEN_PREFIXES
from torchbucket.storage.gcs import GCSConfig

__all__ = ["DemoResult", "run_demo"]

_EMULATOR_BUCKET = "torchbucket-demo"


@dataclass
class EpochRecord:
    """What one epoch did."""

    epoch: int
    job: int
    loss: float
    train_accuracy: float
    val_accuracy: float
    seconds: float
    samples_per_s: float
    batch_losses: list[float] = field(default_factory=list)


@dataclass
class DemoResult:
    """Everything the summary and the figure show."""

    where: str
    objects: int = 0
    dataset_bytes: int = 0
    generate_s: float = 0.0
    upload_s: float = 0.0
    upload_mb_s: float = 0.0
    list_s: float = 0.0
    history: list[EpochRecord] = field(default_factory=list)
    checkpoint_uris: list[str] = field(default_factory=list)
    save_s: list[float] = field(default_factory=list)
    load_s: float = 0.0
    resumed_from_epoch: int = 0
    final_accuracy: float = 0.0
    per_class_accuracy: dict[str, float] = field(default_factory=dict)
    requests: dict[str, dict[str, int]] = field(default_factory=dict)
    request_totals: dict[str, Any] = field(default_factory=dict)
    cost_usd: float = 0.0
    cost_summary: str = ""
    server_cpu_s: float | None = None
    composites_left: int = 0
    uploads_left: int = 0
    total_s: float = 0.0


def _say(message: str) -> None:
    print(message, flush=True)


class _Requests:
    """Requests by class per phase, as the library counts them (on GCS as on the emulator).

    The main process's own requests, plus, for a phase that reads a dataset
    through DataLoader workers, the dataset's ``last_epoch_stats`` (the
    workers' requests, which the main process does not see).
    """

    def __init__(self, emulator: Any) -> None:
        self.emulator = emulator
        self.phases: dict[str, dict[str, int]] = {}
        self.total = accounting.RequestStats()
        self.cpu = 0.0

    @contextlib.contextmanager
    def phase(self, name: str, read: BucketMapDataset | None = None) -> Iterator[None]:
        before = self.emulator.stats() if self.emulator is not None else None
        m = accounting.Measurement()
        try:
            yield
        finally:
            spent = m.stats
            if read is not None:
                spent += read.last_epoch_stats
            self.total += spent
            got = self.phases.setdefault(name, {"A": 0, "B": 0})
            got["A"] += spent.class_a
            got["B"] += spent.class_b
            if before is not None:
                after = self.emulator.stats()
                self.cpu += float(after["cpu_seconds_total"]) - float(before["cpu_seconds_total"])


def _write_dataset(folder: str, config: DemoConfig, n_train: int, n_val: int) -> tuple[int, int]:
    """Draw the images into ``folder`` as ``<split>/<class>/<n>.png``; returns count and bytes."""
    count = size = 0
    made: set[str] = set()
    with tqdm(
        total=n_train + n_val,
        desc="drawing images",
        unit=" img",
        file=sys.stderr,
        leave=False,
        disable=not sys.stderr.isatty(),
    ) as bar:
        for chunk in generate(
            {"train": n_train, "val": n_val},
            seed=config.seed,
            processes=drawing_processes(n_train + n_val),
        ):
            for name, data in chunk:
                path = os.path.join(folder, name)
                parent = os.path.dirname(path)
                if parent not in made:
                    os.makedirs(parent, exist_ok=True)
                    made.add(parent)
                with open(path, "wb") as f:
                    f.write(data)
                count += 1
                size += len(data)
            bar.update(len(chunk))
    return count, size


def _new_model(config: DemoConfig) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = SmallCNN(len(CLASSES))
    return model, torch.optim.Adam(model.parameters(), lr=config.learning_rate)


@dataclass
class _Job:
    """What both jobs of the demo share: the data, the bucket and the tallies."""

    train: Labelled
    val: Labelled
    config: DemoConfig
    checkpoint: BucketCheckpoint
    checkpoint_prefix: str
    result: DemoResult
    requests: _Requests


def _train_epochs(
    run: _Job, *, job: int, epochs: range, model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    config, result, requests = run.config, run.result, run.requests
    for epoch in epochs:
        loader = make_loader(
            run.train,
            batch_size=config.batch_size,
            workers=config.workers,
            shuffle=True,
            seed=config.seed * 1000 + epoch,
        )
        workers = config.workers > 0
        with requests.phase("training", run.train.images if workers else None):
            loss, train_acc, seconds, batch_losses = train_epoch(
                model, optimizer, loader, f"job {job} epoch {epoch}/{config.epochs}"
            )
        val_loader = make_loader(
            run.val, batch_size=256, workers=config.workers, shuffle=False, seed=0
        )
        with requests.phase("evaluation", run.val.images if workers else None):
            val_acc, per_class = evaluate(model, val_loader, f"job {job} validating")
        record = EpochRecord(
            epoch=epoch,
            job=job,
            loss=loss,
            train_accuracy=train_acc,
            val_accuracy=val_acc,
            seconds=seconds,
            samples_per_s=len(run.train) / seconds,
            batch_losses=batch_losses,
        )
        result.history.append(record)
        result.final_accuracy = val_acc
        result.per_class_accuracy = dict(zip(CLASSES, per_class, strict=True))
        uri = f"{run.checkpoint_prefix}epoch-{epoch:04d}.pt"
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "epoch": epoch,
            "history": [asdict(r) for r in result.history],
        }
        started = time.perf_counter()
        with requests.phase("checkpoint save"), run.checkpoint.writer(uri) as f:
            torch.save(state, cast(IO[bytes], f))
        result.save_s.append(time.perf_counter() - started)
        result.checkpoint_uris.append(uri)
        _say(
            f"  job {job} epoch {epoch}: loss {loss:.3f}, train accuracy {train_acc:.1%}, "
            f"held-out accuracy {val_acc:.1%}, {record.samples_per_s:,.0f} samples/s "
            f"({seconds:.1f} s); checkpoint {uri} in {result.save_s[-1]:.2f} s"
        )


def _open_bucket(
    stack: contextlib.ExitStack[Any], config: DemoConfig
) -> tuple[Any, str, GCSConfig, str]:
    """The emulator started (or None), the base URI, the GCS config and where it runs."""
    if config.bucket is not None:
        base = config.bucket if config.bucket.endswith("/") else config.bucket + "/"
        return None, base, GCSConfig(endpoint=config.endpoint), base
    from torchbucket.emulator import Emulator

    latency = "same-region" if config.latency else None
    _say(
        "Starting a local GCS emulator (in-memory model store"
        + (
            ", same-region latency: ~20 ms to first byte, ~40 ms per write, ~60 ms per list page)"
            if latency
            else ", no modelled latency)"
        )
    )
    emulator = stack.enter_context(Emulator(backend="model", latency=latency))
    emulator.create_bucket(_EMULATOR_BUCKET)
    _say(f"  endpoint {emulator.endpoint}, bucket gs://{_EMULATOR_BUCKET}")
    return (
        emulator,
        f"gs://{_EMULATOR_BUCKET}/",
        GCSConfig(endpoint=emulator.endpoint),
        f"local GCS emulator, {latency or 'no'} latency",
    )


def _put_dataset(
    stack: contextlib.ExitStack[Any],
    config: DemoConfig,
    data_uri: str,
    gcs: GCSConfig,
    *,
    reuse: bool,
    result: DemoResult,
    requests: _Requests,
) -> None:
    """A dataset of many small files, put in place the way a user would (or found there)."""
    if reuse and len(list_uris(data_uri, gcs)) == config.objects:
        _say(f"Reusing the {config.objects:,} images already under {data_uri}")
        result.objects = config.objects
        return
    n_val = max(len(CLASSES), config.objects // 6)
    n_train = config.objects - n_val
    folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="torchbucket-demo-"))
    started = time.perf_counter()
    result.objects, result.dataset_bytes = _write_dataset(folder, config, n_train, n_val)
    result.generate_s = time.perf_counter() - started
    _say(
        f"Drew {result.objects:,} PNG images of {len(CLASSES)} shapes "
        f"({mib(result.dataset_bytes)}) in {result.generate_s:.1f} s"
    )
    with requests.phase("upload"):
        stats = upload_folder(folder, data_uri, gcs, jobs=128)
    result.upload_s = stats.seconds
    result.upload_mb_s = stats.bytes / 1e6 / stats.seconds if stats.seconds > 0 else 0.0
    _say(
        f"Uploaded them to {data_uri}, 128 at a time: "
        f"{stats.objects:,} objects in {stats.seconds:.1f} s, "
        f"{stats.objects / stats.seconds:,.0f} objects/s"
    )
    shutil.rmtree(folder, ignore_errors=True)


def _list_splits(
    config: DemoConfig, data_uri: str, gcs: GCSConfig, result: DemoResult, requests: _Requests
) -> tuple[Labelled, Labelled]:
    """List once, in the main process, before the DataLoader forks."""
    compose = ComposeConfig() if config.compose else None
    started = time.perf_counter()
    with requests.phase("listing"):
        train = Labelled(
            BucketMapDataset.from_prefix(
                data_uri + "train/", data_format_fn=decode, gcs=gcs, compose=compose
            )
        )
        val = Labelled(
            BucketMapDataset.from_prefix(
                data_uri + "val/", data_format_fn=decode, gcs=gcs, compose=compose
            )
        )
    result.list_s = time.perf_counter() - started
    _say(
        f"Listed {len(train):,} training and {len(val):,} held-out images in {result.list_s:.2f} s"
    )
    return train, val


def _resume(run: _Job, gcs: GCSConfig) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A restarted job finds the latest checkpoint and loads it."""
    result = run.result
    started = time.perf_counter()
    with run.requests.phase("checkpoint load"):
        names = list_uris(run.checkpoint_prefix, gcs)
        latest = max(names)
        # The tensors are the downloaded bytes, not copies (BucketCheckpoint.load).
        state = run.checkpoint.load(latest, map_location="cpu", weights_only=True)
    result.load_s = time.perf_counter() - started
    model, optimizer = _new_model(run.config)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    result.resumed_from_epoch = int(state["epoch"])
    _say(
        f"Job 2: found {plural(len(names), 'checkpoint')}, loaded {latest} (epoch "
        f"{result.resumed_from_epoch}, {plural(len(state['history']), 'epoch')} of history) in "
        f"{result.load_s:.2f} s; resuming at epoch {result.resumed_from_epoch + 1}"
    )
    return model, optimizer


def _tally(emulator: Any, base: str, gcs: GCSConfig, run: _Job) -> None:
    """Nothing may be left behind (no composed object, no incomplete upload); what it cost."""
    result, requests = run.result, run.requests
    composed, uploads = find_leftovers(base, gcs)
    result.composites_left = len(composed)
    if emulator is not None:  # the server's own view, not only what a listing shows
        result.composites_left = len(emulator.object_names(_EMULATOR_BUCKET, HIDDEN_PREFIXES[0]))
    result.uploads_left = len(uploads)
    result.requests = requests.phases
    result.request_totals = requests.total.to_dict()
    spent = estimate(requests.total)
    result.cost_usd, result.cost_summary = spent.total_usd, spent.summary()
    result.server_cpu_s = requests.cpu if emulator is not None else None


def run_demo(config: DemoConfig) -> DemoResult:
    """Run the demo end to end and return what it measured.

    Raises:
        StorageError: The bucket could not be used.
        ConfigError: Bad options.
    """
    wall = time.perf_counter()
    torch.manual_seed(config.seed)
    os.makedirs(config.out, exist_ok=True)
    with contextlib.ExitStack() as stack:
        emulator, base, gcs, where = _open_bucket(stack, config)
        result = DemoResult(where=where)
        requests = _Requests(emulator)
        data_uri = f"{base}shapes-{config.objects}-seed{config.seed}/"

        # 1. A dataset of many small files, put in place the way a user would.
        _put_dataset(
            stack,
            config,
            data_uri,
            gcs,
            reuse=emulator is None,
            result=result,
            requests=requests,
        )
        # 2. List once, in the main process, before the DataLoader forks.
        train, val = _list_splits(config, data_uri, gcs, result, requests)
        run = _Job(
            train=train,
            val=val,
            config=config,
            checkpoint=BucketCheckpoint(gcs=gcs),
            checkpoint_prefix=f"{base}checkpoints/run-{uuid.uuid4().hex[:8]}/",
            result=result,
            requests=requests,
        )

        # 3. The first job trains a few epochs, checkpointing each, then "crashes".
        first = config.first_job_epochs
        _say(
            f"Job 1: training a small CNN for epochs 1-{first} with "
            f"{config.workers} DataLoader workers, batch {config.batch_size}"
        )
        model, optimizer = _new_model(config)
        _train_epochs(run, job=1, epochs=range(1, first + 1), model=model, optimizer=optimizer)
        del model, optimizer
        _say(
            "Job 1 stops here, as if its node were lost. Job 2 starts from nothing but the bucket."
        )

        # 4. A restarted job finds the latest checkpoint and carries on from it.
        model, optimizer = _resume(run, gcs)
        _train_epochs(
            run,
            job=2,
            epochs=range(result.resumed_from_epoch + 1, config.epochs + 1),
            model=model,
            optimizer=optimizer,
        )

        # 5. Nothing may be left behind: no composed object, no incomplete upload.
        _tally(emulator, base, gcs, run)
    result.total_s = time.perf_counter() - wall
    return result
