"""Eager fp32 in channels-last (NHWC) memory format, which oneDNN's convolution and pooling
kernels prefer on CPU; the artifact is the eager weights, laid out again when loaded."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from tuner.deploy.backends.base import BACKENDS, Backend, Logits
from tuner.deploy.backends.support.torch_files import export_weights, load_weights


def _load(artifact: Path, deploy: DictConfig) -> Logits:
    model = load_weights(artifact).to(memory_format=torch.channels_last)

    def logits_of(images: torch.Tensor) -> torch.Tensor:
        return model(images.contiguous(memory_format=torch.channels_last))

    return logits_of


BACKENDS.register("channels_last")(
    Backend(
        name="channels_last", export=export_weights, load=_load, modalities=frozenset({"image"})
    )
)
