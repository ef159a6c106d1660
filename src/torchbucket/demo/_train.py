"""Training pieces of the demo: the labelled dataset, loaders, one epoch, evaluation."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from torchbucket.datasets import BucketMapDataset
from torchbucket.demo._data import CLASSES, label_of

__all__ = ["Labelled", "evaluate", "make_loader", "train_epoch"]


class Labelled(Dataset[tuple[torch.Tensor, int]]):
    """Images from a bucket, labelled by their "folder" (``<split>/<class>/<n>.png``)."""

    def __init__(self, images: BucketMapDataset) -> None:
        self.images = images
        self.labels = [label_of(images.uri(i)) for i in range(len(images))]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, int]]:
        # The whole batch in one concurrent fetch.
        images = self.images.__getitems__(indices)
        return [(image, self.labels[i]) for image, i in zip(images, indices, strict=True)]


def _bar(total: int, desc: str) -> tqdm[Any]:
    return tqdm(
        total=total,
        desc=desc,
        unit=" img",
        file=sys.stderr,
        leave=False,
        dynamic_ncols=True,
        disable=not sys.stderr.isatty(),
    )


def make_loader(
    dataset: Labelled, *, batch_size: int, workers: int, shuffle: bool, seed: int
) -> DataLoader[Any]:
    """A DataLoader with automatic batching, so each batch is one concurrent fetch."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=workers,
        generator=generator,
        prefetch_factor=4 if workers else None,
        persistent_workers=False,
    )


def train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: DataLoader[Any],
    desc: str,
) -> tuple[float, float, float, list[float]]:
    """One epoch; returns mean loss, accuracy, wall seconds and each batch's loss."""
    model.train()
    loss_fn = nn.CrossEntropyLoss()
    total_loss = correct = seen = 0.0
    losses: list[float] = []
    started = time.perf_counter()
    with _bar(len(loader.dataset), desc) as bar:  # type: ignore[arg-type]
        for images, labels in loader:
            optimizer.zero_grad(set_to_none=True)
            logits = model(images)
            loss = loss_fn(logits, labels)
            loss.backward()
            optimizer.step()
            n = len(labels)
            losses.append(loss.item())
            total_loss += losses[-1] * n
            correct += float((logits.argmax(1) == labels).sum())
            seen += n
            bar.update(n)
            bar.set_postfix(loss=f"{total_loss / seen:.3f}", refresh=False)
    return total_loss / seen, correct / seen, time.perf_counter() - started, losses


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader[Any], desc: str) -> tuple[float, list[float]]:
    """Accuracy overall and per class."""
    model.eval()
    hits = torch.zeros(len(CLASSES))
    counts = torch.zeros(len(CLASSES))
    with _bar(len(loader.dataset), desc) as bar:  # type: ignore[arg-type]
        for images, labels in loader:
            right = (model(images).argmax(1) == labels).float()
            hits.index_add_(0, labels, right)
            counts.index_add_(0, labels, torch.ones_like(right))
            bar.update(len(labels))
    per_class = (hits / counts.clamp(min=1)).tolist()
    return float(hits.sum() / counts.sum()), per_class
