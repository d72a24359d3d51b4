"""torch.compile (Inductor) with weight freezing: the PyTorch-native fused route.

Freezing makes the weights constants of the compiled graph, so Inductor folds what depends on
them alone, fuses the element-wise ops around each matmul and convolution into their kernels,
and on x86 prepacks the weights into oneDNN's blocked layout once instead of on every call.
It applies to inference only (no gradients), which is how deployment and serving call models.
Compiling happens on the first call, during conversion, as for `compile`. The setting goes in as
an Inductor option, not a global one: a backend's options are part of what Dynamo checks before
reusing a compiled graph, so a model compiled earlier in the process (by `compile`) is not
served unfrozen. torch.compile takes options or a mode, not both: this backend runs Inductor's
default mode, and `deploy.compile.mode` applies to `compile` only.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from tuner.backends.base import BACKENDS, Backend, Logits
from tuner.backends.compiled import INDUCTOR_KERNELS, compile_unavailable
from tuner.backends.torch_files import export_weights, load_weights


def _load(artifact: Path, deploy: DictConfig) -> Logits:
    compiled = torch.compile(load_weights(artifact), dynamic=True, options={"freezing": True})

    def logits_of(*inputs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # freezing applies to graphs that need no gradients
            return compiled(*inputs)

    return logits_of


BACKENDS.register("compile_frozen")(
    Backend(
        name="compile_frozen",
        export=export_weights,
        load=_load,
        unavailable_reason=compile_unavailable,
        graph=None,
        no_graph_reason=INDUCTOR_KERNELS,
    )
)
