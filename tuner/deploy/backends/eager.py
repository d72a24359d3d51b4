"""Eager PyTorch in fp32: the reference every other backend is compared with."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from tuner.deploy.backends.base import BACKENDS, Backend, Logits
from tuner.deploy.backends.support.torch_files import export_weights, load_weights


def _load(artifact: Path, deploy: DictConfig) -> Logits:
    return load_weights(artifact)


BACKENDS.register("eager")(Backend(name="eager", export=export_weights, load=_load))
