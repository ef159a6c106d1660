"""The demo's model: a small CNN for 32x32 RGB images, cheap enough for a laptop CPU."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SmallCNN"]


class SmallCNN(nn.Module):
    """Three conv blocks (16, 32, 64 channels) and a two-layer head.

    Args:
        classes: Number of output classes.
    """

    def __init__(self, classes: int) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            )

        self.features = nn.Sequential(block(3, 16), block(16, 32), block(32, 64))
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * 4 * 4, 64), nn.ReLU(inplace=True), nn.Linear(64, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape ``(batch, classes)`` for images of shape ``(batch, 3, 32, 32)``."""
        return self.head(self.features(x))  # type: ignore[no-any-return]
