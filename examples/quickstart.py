"""Read one batch of images from a bucket prefix.

    python examples/quickstart.py [gs://my-bucket/train/]

Lists the prefix, decodes each PNG to a 3x32x32 uint8 tensor in DataLoader
workers, and prints the first batch's shape. Against the local emulator, set
STORAGE_EMULATOR_HOST first (``torchbucket emulator`` prints the line).
"""

from __future__ import annotations

import io
import sys

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

from torchbucket import BucketMapDataset


def decode(data: bytes) -> torch.Tensor:
    image = Image.open(io.BytesIO(data)).convert("RGB")  # grayscale or RGBA -> RGB
    return torch.from_numpy(np.array(image)).permute(2, 0, 1)  # np.array copies: writable


def main() -> None:
    uri = sys.argv[1] if len(sys.argv) > 1 else "gs://my-bucket/train/"
    train = BucketMapDataset.from_prefix(uri, data_format_fn=decode)
    loader = DataLoader(train, batch_size=64, shuffle=True, num_workers=2)
    batch = next(iter(loader))
    print(f"{len(train)} objects under {uri}; first batch: {tuple(batch.shape)} {batch.dtype}")


if __name__ == "__main__":
    main()
