"""A process that starts a checkpoint save and never finishes it (the test SIGKILLs it).

Usage: _crash_saver.py ENDPOINT URI. Writes through ``BucketCheckpoint.writer``
until several parts have been handed to the upload, prints ``UPLOADING``, then
keeps writing slowly, as a long ``torch.save`` would, until killed.
"""

from __future__ import annotations

import sys
import time

from torchbucket.checkpoint import BucketCheckpoint, CheckpointConfig
from torchbucket.storage.gcs import GCSConfig

PART = 64 * 1024


def main() -> None:
    endpoint, uri = sys.argv[1:3]
    checkpoint = BucketCheckpoint(
        config=CheckpointConfig(part_size=PART, min_part_size=1, parts_in_flight=2),
        gcs=GCSConfig(endpoint=endpoint, anonymous=True),
    )
    chunk = bytes(range(256)) * 64  # 16 KiB
    with checkpoint.writer(uri) as f:
        while f.tell() < 4 * PART:
            f.write(chunk)
        print("UPLOADING", flush=True)
        while True:
            f.write(chunk)
            time.sleep(0.05)


if __name__ == "__main__":
    main()
