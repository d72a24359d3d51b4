"""Whole PyTorch modules as files, shared by the backends that ship a PyTorch model.

The module is pickled whole (architecture and weights) because structural edits and
quantisation change the architecture: a state dict alone could not be loaded without replaying
them. Loading therefore needs `tuner` importable, which the logged MLflow model provides by
shipping the package as code.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def save_module(module: nn.Module, path: Path) -> Path:
    torch.save(module, path)
    return path


def load_module(path: Path) -> nn.Module:
    # Full unpickling is needed for a whole module; only load artifacts this project wrote.
    module = torch.load(path, weights_only=False, map_location="cpu")
    return module.eval()
