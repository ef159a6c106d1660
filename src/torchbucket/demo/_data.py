"""The demo's dataset: small PNG images of shapes, drawn on the spot.

Six classes (circle, square, triangle, cross, ring, diamond) in random colours,
sizes and positions over a noisy background: easy enough for a small CNN to
learn in a few epochs on a CPU, hard enough that it does not learn it in one
batch. Images are laid out as an image folder, ``<split>/<class>/<index>.png``,
so the label is the object's parent "folder", as in ``torchvision``'s
``ImageFolder``. Nothing is downloaded.
"""

from __future__ import annotations

import io
import math
import multiprocessing
import os
from collections.abc import Iterator

import numpy as np
import torch
from PIL import Image, ImageDraw

__all__ = [
    "CLASSES",
    "IMAGE_SIZE",
    "decode",
    "drawing_processes",
    "generate",
    "label_of",
    "object_name",
    "render",
]

CLASSES = ("circle", "square", "triangle", "cross", "ring", "diamond")
IMAGE_SIZE = 32
_MEAN = 0.5
_STD = 0.25


def object_name(split: str, index: int) -> str:
    """The object name of image ``index`` of a split: ``train/ring/004711.png``."""
    return f"{split}/{CLASSES[index % len(CLASSES)]}/{index:06d}.png"


def label_of(name: str) -> int:
    """The class index of an object name laid out as ``.../<class>/<file>``."""
    return CLASSES.index(name.rsplit("/", 2)[-2])


def _colour(rng: np.random.Generator, lo: int, hi: int) -> tuple[int, int, int]:
    r, g, b = (int(v) for v in rng.integers(lo, hi, size=3))
    return (r, g, b)


def render(index: int, seed: int = 0) -> bytes:
    """Draw image ``index`` (its class is ``index % 6``) and return it as PNG bytes.

    The same ``(index, seed)`` always gives the same bytes.
    """
    rng = np.random.default_rng((seed, index))
    label = index % len(CLASSES)
    size = IMAGE_SIZE
    dark_background = bool(rng.integers(0, 2))
    background = _colour(rng, 0, 120) if dark_background else _colour(rng, 135, 256)
    ink = _colour(rng, 110, 256) if dark_background else _colour(rng, 0, 146)
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    # A distractor: a thin line in a third colour, somewhere, under the shape.
    x0, y0, x1, y1 = (float(v) for v in rng.uniform(0, size, size=4))
    draw.line((x0, y0, x1, y1), fill=_colour(rng, 0, 256), width=1)
    r = float(rng.uniform(4.5, 11.0))
    cx, cy = (float(v) for v in rng.uniform(r + 1, size - r - 1, size=2))
    width = max(2, round(r / 3))
    shape = CLASSES[label]
    if shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=ink)
    elif shape == "ring":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=ink, width=width)
    elif shape == "square":
        s = r * 0.85
        draw.rectangle((cx - s, cy - s, cx + s, cy + s), fill=ink)
    elif shape == "diamond":
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=ink)
    elif shape == "triangle":
        turn = float(rng.uniform(0, 2 * math.pi))
        points = [
            (
                cx + r * math.cos(turn + k * 2 * math.pi / 3),
                cy + r * math.sin(turn + k * 2 * math.pi / 3),
            )
            for k in range(3)
        ]
        draw.polygon(points, fill=ink)
    else:  # cross
        draw.rectangle((cx - r, cy - width / 2, cx + r, cy + width / 2), fill=ink)
        draw.rectangle((cx - width / 2, cy - r, cx + width / 2, cy + r), fill=ink)
    pixels = np.asarray(image, dtype=np.int16)
    noise = rng.normal(0.0, 30.0, size=pixels.shape).astype(np.int16)
    noisy = np.clip(pixels + noise, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    # Noise does not compress: zlib would cost time and save nothing.
    Image.fromarray(noisy).save(out, format="PNG", compress_level=0)
    return out.getvalue()


def decode(data: bytes) -> torch.Tensor:
    """PNG bytes -> a normalised ``float32`` tensor of shape ``(3, 32, 32)``."""
    with Image.open(io.BytesIO(data)) as image:
        array = np.asarray(image.convert("RGB"), dtype=np.float32)
    tensor = torch.from_numpy(array).permute(2, 0, 1)
    return (tensor / 255.0 - _MEAN) / _STD


#: From this many images on, a pool draws them. Below it one process is
#: quicker: an image takes about 0.3 ms to draw, and a pool of spawned
#: processes about 1.5 s to start (each imports torch; measured on a 2-core VM:
#: 240 images, 0.07 s in process against 1.6 s through a pool of two).
POOL_FROM = 10_000


def drawing_processes(images: int) -> int:
    """How many processes :func:`generate` should draw ``images`` images with."""
    return min(2, os.cpu_count() or 1) if images >= POOL_FROM else 1


def _render_many(args: tuple[str, int, int, int]) -> list[tuple[str, bytes]]:
    split, start, stop, seed = args
    return [(object_name(split, i), render(i, seed)) for i in range(start, stop)]


def generate(
    split_sizes: dict[str, int], *, seed: int = 0, processes: int = 2, chunk: int = 500
) -> Iterator[list[tuple[str, bytes]]]:
    """Draw every image of every split, in parallel, in chunks.

    Args:
        split_sizes: Images per split, e.g. ``{"train": 16000, "val": 4000}``.
        seed: Picks the images; the same seed draws the same dataset.
        processes: Worker processes drawing images (1 draws in this process).
        chunk: Images per task.

    Yields:
        Lists of ``(object name, PNG bytes)``, in no particular order.
    """
    offset = 0
    tasks = []
    for split, count in split_sizes.items():
        # Disjoint index ranges, so splits never share an image.
        for start in range(offset, offset + count, chunk):
            tasks.append((split, start, min(start + chunk, offset + count), seed))
        offset += count
    if processes <= 1:
        for task in tasks:
            yield _render_many(task)
        return
    # Not fork: by now this process runs threads (torchbucket's loop, tqdm's
    # monitor), and a child forked while one of them holds a lock can hang.
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes) as pool:
        yield from pool.imap_unordered(_render_many, tasks)
