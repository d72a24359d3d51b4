"""Images: pixels standardised by the training split's mean and standard deviation, at the
data's own resolution; served as an array of raw pixel values, (N, H, W) or (N, C, H, W)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, Schema, TensorSpec
from omegaconf import DictConfig

from tuner.config import SearchSpace
from tuner.data import ExampleInputs, ImageTensors, Splits
from tuner.errors import ConfigError
from tuner.latency import LatencyProtocol
from tuner.modalities.base import MODALITIES, Modality
from tuner.serving import IMAGE_SETTINGS, ServingImages, with_channels


@MODALITIES.register("image")
class ImageModality(Modality):
    name = "image"

    def __init__(self, shape: tuple[int, int, int], mean: float, std: float) -> None:
        self.shape = shape  # (channels, height, width)
        self.mean = mean
        self.std = std

    @classmethod
    def from_config(cls, cfg: DictConfig, splits: Splits) -> ImageModality:
        pixels = with_channels(np.asarray(splits.train.items, dtype=np.float32))
        if pixels.ndim != 4:
            raise ConfigError(
                f"Invalid data in {splits.origin}: images must be (N, H, W) or (N, C, H, W), "
                f"got shape {pixels.shape}"
            )
        channels, height, width = (int(size) for size in pixels.shape[1:])
        in_chans = cfg.model.get("in_chans")
        if in_chans != channels:
            raise ConfigError(
                f"Invalid config: key 'model.in_chans': {in_chans}, but the images of "
                f"{splits.origin} have {channels} channel(s)"
            )
        return cls((channels, height, width), float(pixels.mean()), float(pixels.std()) or 1.0)

    @staticmethod
    def check(cfg: DictConfig, space: SearchSpace) -> None:
        """Image models take every training knob, cutmix included."""

    def encode(self, items: Sequence[Any], labels: Sequence[int] | None = None) -> ImageTensors:
        # Standardised by serving's own code, so that training and serving see the same pixels.
        served = ServingImages(self.shape, self.mean, self.std)
        images = torch.from_numpy(served.standardised(items))
        targets = (
            torch.tensor(list(labels), dtype=torch.long)
            if labels is not None
            else torch.zeros(len(images), dtype=torch.long)
        )
        return ImageTensors(images, targets)

    def example(self, items: Sequence[Any], protocol: LatencyProtocol) -> ExampleInputs:
        """Real images at the data's resolution; the protocol's seq_len does not apply."""
        index = np.arange(protocol.batch_size) % len(items)
        images = self.encode(np.asarray(items)[index]).images
        dynamic = {"images": {0: "batch", 2: "height", 3: "width"}}
        return ExampleInputs((images,), ("images",), dynamic)

    def save(self, directory: Path) -> None:
        settings = {"shape": list(self.shape), "mean": self.mean, "std": self.std}
        (directory / IMAGE_SETTINGS).write_text(json.dumps(settings))

    @classmethod
    def load(cls, directory: Path) -> ImageModality:
        settings = json.loads((directory / IMAGE_SETTINGS).read_text())
        return cls(tuple(settings["shape"]), float(settings["mean"]), float(settings["std"]))

    def signature(self) -> ModelSignature:
        channels, height, width = self.shape
        shape = (-1, height, width) if channels == 1 else (-1, channels, height, width)
        return ModelSignature(
            inputs=Schema([TensorSpec(np.dtype(np.float32), shape)]),
            outputs=Schema([ColSpec("string", "label"), ColSpec("double", "score")]),
        )

    @staticmethod
    def serving_input(items: Sequence[Any]) -> np.ndarray:
        return np.asarray(items, dtype=np.float32)
