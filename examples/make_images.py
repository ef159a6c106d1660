"""Write a small image dataset to a local folder, ready for ``torchbucket cp``.

    python examples/make_images.py ./images

makes ``./images/<class>/<n>.png``: 256 PNGs of 32x32 pixels in four classes
(a colour fill of each class, with noise), some of them grayscale, as real
image folders often mix modes. Needs Pillow (``pip install pillow``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = {"red": (200, 40, 40), "green": (40, 180, 60), "blue": (40, 60, 200), "gray": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where to write <class>/<n>.png")
    parser.add_argument("--count", type=int, default=256, help="images in all (default: 256)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for i in range(args.count):
        name = list(CLASSES)[i % len(CLASSES)]
        folder = args.folder / name
        folder.mkdir(parents=True, exist_ok=True)
        noise = rng.integers(-30, 30, size=(32, 32, 3))
        colour = CLASSES[name]
        if colour is None:  # a grayscale ("L" mode) image
            pixels = np.clip(128 + noise[..., 0], 0, 255).astype(np.uint8)
            image = Image.fromarray(pixels, mode="L")
        else:
            pixels = np.clip(np.array(colour) + noise, 0, 255).astype(np.uint8)
            image = Image.fromarray(pixels, mode="RGB")
        image.save(folder / f"{i:05d}.png")
    print(f"wrote {args.count} images under {args.folder}/")


if __name__ == "__main__":
    main()
