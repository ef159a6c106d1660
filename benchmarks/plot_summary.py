"""Summary figures for README.md and docs/benchmarks.md, from stored results.

    python benchmarks/plot_summary.py [--out docs/img]

Re-plots the latest stored figures (the tables of docs/benchmarks.md; no
benchmark is run) as one small figure per question: a few horizontal bars with
horizontal labels, torchbucket highlighted against the best of each peer.
Update ``FIGURES`` after a new run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HIGHLIGHT = "#d9480f"
PEER = "#adb5bd"

# (title, unit, higher_is_better, panels: (panel title, [(label, value), ...]))
FIGURES: dict[str, tuple[str, str, bool, list[tuple[str, list[tuple[str, float]]]]]] = {
    "summary_dataloading": (
        "DataLoader throughput (2 workers, batch 64; higher is better)",
        "objects/s",
        True,
        [
            (
                "6,000 x 10 KiB objects",
                [
                    ("torchbucket", 9828),
                    ("gcsfs fs.cat per batch", 2160),
                    ("gcs-torch-dataflux (best)", 1007),
                    ("plain per-object Dataset", 84),
                ],
            ),
            (
                "10,000 x 100 KiB objects",
                [
                    ("torchbucket (tensor output)", 6227),
                    ("gcsfs fs.cat per batch", 1993),
                    ("gcs-torch-dataflux (best)", 899),
                    ("plain per-object Dataset", 84),
                ],
            ),
        ],
    ),
    "summary_listing": (
        "Listing 100,000 objects (lower is better)",
        "seconds",
        False,
        [
            (
                "hashed names",
                [
                    ("torchbucket", 0.449),
                    ("gcs-torch-dataflux (best)", 3.516),
                    ("sequential pages", 7.835),
                    ("gcsfs fs.find", 8.034),
                ],
            ),
            (
                "ImageNet-style folders",
                [
                    ("torchbucket", 0.714),
                    ("sequential pages", 7.814),
                    ("gcsfs fs.find", 8.112),
                    ("gcs-torch-dataflux (best)", 8.685),
                ],
            ),
        ],
    ),
    "summary_checkpoint": (
        "512 MiB checkpoint: time relative to torchbucket (lower is better)",
        "x torchbucket's time",
        False,
        [
            (
                "save (torch.save)",
                [
                    ("torchbucket", 1.0),
                    ("gcs-torch-dataflux", 2.13),
                    ("google-cloud-storage", 5.89),
                    ("gcsfs fs.open", 7.81),
                ],
            ),
            (
                "load (torch.load)",
                [
                    ("torchbucket", 1.0),
                    ("google-cloud-storage", 8.52),
                    ("gcs-torch-dataflux", 8.59),
                    ("gcsfs fs.open", 86.6),
                ],
            ),
        ],
    ),
}


def _label(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}".rstrip("0").rstrip(".")


def plot(name: str, out: Path) -> Path:
    title, unit, _higher, panels = FIGURES[name]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 2.6), squeeze=False)
    for ax, (panel, bars) in zip(axes[0], panels):
        labels = [label for label, _ in bars][::-1]
        values = [value for _, value in bars][::-1]
        colors = [HIGHLIGHT if lb.startswith("torchbucket") else PEER for lb in labels]
        ax.barh(labels, values, color=colors, height=0.6)
        top = max(values)
        for y, value in enumerate(values):
            ax.text(value + top * 0.01, y, _label(value), va="center", fontsize=9)
        ax.set_xlim(0, top * 1.18)
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel(unit, fontsize=9)
        ax.tick_params(axis="y", labelsize=9)
        ax.tick_params(axis="x", labelsize=8)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parents[1] / "docs" / "img")
    args = parser.parse_args()
    for name in FIGURES:
        print(plot(name, args.out))


if __name__ == "__main__":
    main()
