"""Eager fp32 with every batch norm folded into the convolution before it (inference only: the
running statistics become the convolution's weights and bias), by torch.fx's fusion pass. The
artifact is the eager weights; folding happens when it is loaded, in well under a second."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from torch.fx.experimental.optimization import fuse

from tuner.deploy.backends.base import BACKENDS, Backend, Logits
from tuner.deploy.backends.support.torch_files import export_weights, load_weights


def _load(artifact: Path, deploy: DictConfig) -> Logits:
    return fuse(load_weights(artifact))


BACKENDS.register("conv_bn_folded")(
    Backend(
        name="conv_bn_folded", export=export_weights, load=_load, modalities=frozenset({"image"})
    )
)
