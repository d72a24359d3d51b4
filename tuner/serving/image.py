"""Images served as arrays of raw pixel values, (N, H, W) or (N, C, H, W), standardised by the
training split's mean and standard deviation saved by `tuner.modalities`."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tuner.serving.inputs import BATCH_SIZE, SERVING_INPUTS, InputBatch, ServingInputs

IMAGE_SETTINGS = "image_inputs.json"


def with_channels(images: np.ndarray) -> np.ndarray:
    """(N, H, W) greyscale gets its channel axis: (N, 1, H, W)."""
    return images[:, None] if images.ndim == 3 else images


@SERVING_INPUTS.register("image")
class ServingImages(ServingInputs):
    packages = ()

    def __init__(self, shape: tuple[int, int, int], mean: float, std: float) -> None:
        self.shape = shape  # (channels, height, width)
        self.mean = mean
        self.std = std

    @classmethod
    def load(cls, directory: Path) -> ServingImages:
        settings = json.loads((directory / IMAGE_SETTINGS).read_text())
        return cls(tuple(settings["shape"]), float(settings["mean"]), float(settings["std"]))

    def items_of(self, model_input: Any) -> np.ndarray:
        return np.asarray(model_input, dtype=np.float32)

    def standardised(self, items: Sequence[Any]) -> np.ndarray:
        """The images as the model takes them, (N, C, H, W), in float32."""
        pixels = with_channels(np.asarray(items, dtype=np.float32))
        if pixels.shape[1:] != self.shape:
            raise ValueError(
                f"expected images of shape {self.shape} (or {self.shape[1:]} for one channel), "
                f"got {pixels.shape[1:]}"
            )
        return (pixels - np.float32(self.mean)) / np.float32(self.std)

    def batches(self, items: Sequence[Any]) -> Iterator[InputBatch]:
        """In the order given: every image has one size."""
        images = self.standardised(items)
        for start in range(0, len(images), BATCH_SIZE):
            index = np.arange(start, min(start + BATCH_SIZE, len(images)))
            yield index, (images[index],)
