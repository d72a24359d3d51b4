"""torch.compile (Inductor) with weight freezing: the PyTorch-native fused route.

Freezing makes the weights constants of the compiled graph, so Inductor folds what depends on
them alone, fuses the element-wise ops around each matmul and convolution into their kernels,
and on x86 prepacks the weights into oneDNN's blocked layout once instead of on every call.
It applies to inference only (no gradients), which is how deployment and serving call models.
Compiling happens on the first call, during conversion, as for `compile`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from tuner.backends.base import BACKENDS, Backend, Logits
from tuner.backends.compiled import compile_unavailable
from tuner.backends.torch_files import export_weights, load_weights


def _load(artifact: Path, deploy: DictConfig) -> Logits:
    from torch._inductor import config as inductor_config

    compiled = torch.compile(load_weights(artifact), mode=str(deploy.compile.mode), dynamic=True)

    def logits_of(*inputs: torch.Tensor) -> torch.Tensor:
        # Inductor reads the setting when it compiles: on the first call, and again when a
        # new input shape makes it recompile.
        with inductor_config.patch(freezing=True), torch.no_grad():
            return compiled(*inputs)

    return logits_of


BACKENDS.register("compile_frozen")(
    Backend(
        name="compile_frozen",
        export=export_weights,
        load=_load,
        unavailable_reason=compile_unavailable,
    )
)
