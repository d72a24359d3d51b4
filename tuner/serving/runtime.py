"""What a runtime is: how a logged model runs a backend's artifact without PyTorch, and what a
fresh environment installs to do it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tuner.registry import Registry

# Model inputs as arrays (token ids and attention mask, or images) -> logits.
Runner = Callable[..., np.ndarray]


@dataclass(frozen=True)
class Runtime:
    """A runtime that serves artifacts with numpy arrays in and out.

    Attributes:
        load: artifact + the point's `deploy` settings -> a runner; what both deployment (which
            measures it) and serving (which ships it) call.
        packages: the distributions serving needs besides those every logged model needs.
    """

    load: Callable[[Path, Mapping[str, Any]], Runner]
    packages: tuple[str, ...]


RUNTIMES: Registry[Runtime] = Registry("runtime")
