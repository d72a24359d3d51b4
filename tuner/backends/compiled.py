"""torch.compile (Inductor) with dynamic shapes over the shipped eager model.

Compiling happens on the first call, which deployment makes during conversion, so compile time
counts as conversion and not as latency.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from omegaconf import DictConfig

from tuner.backends.base import BACKENDS, Backend, Logits
from tuner.backends.torch_files import export_weights, load_weights

# Why the compiled backends' points have no operator graph.
INDUCTOR_KERNELS = (
    "runs code Inductor generates when the artifact is loaded: its kernels are no operator "
    "graph to dump"
)


def compile_unavailable() -> str | None:
    if not any(shutil.which(compiler) for compiler in ("c++", "g++", "clang++")):
        return "Inductor needs a C++ compiler (c++, g++ or clang++) on PATH"
    return None


def _load(artifact: Path, deploy: DictConfig) -> Logits:
    return torch.compile(load_weights(artifact), mode=str(deploy.compile.mode), dynamic=True)


BACKENDS.register("compile")(
    Backend(
        name="compile",
        export=export_weights,
        load=_load,
        unavailable_reason=compile_unavailable,
        graph=None,
        no_graph_reason=INDUCTOR_KERNELS,
    )
)
