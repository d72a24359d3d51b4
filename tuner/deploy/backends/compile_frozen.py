"""torch.compile (Inductor) with weight freezing: the PyTorch-native fused route, in fp32
(`compile_frozen`) and with its matmuls in bf16 (`compile_frozen_bf16`).

Freezing makes the weights constants of the compiled graph, so Inductor folds what depends on
them alone, fuses the element-wise ops around each matmul and convolution into their kernels,
and on x86 prepacks the weights into oneDNN's blocked layout once instead of on every call.
It applies to inference only (no gradients), which is how deployment and serving call models.
Compiling happens on the first call, during conversion, as for `compile`. The setting goes in as
an Inductor option, not a global one: a backend's options are part of what Dynamo checks before
reusing a compiled graph, so a model compiled earlier in the process (by `compile`) is not
served unfrozen. torch.compile takes options or a mode, not both: this backend runs Inductor's
default mode, and `deploy.compile.mode` applies to `compile` only.

The bf16 variant compiles under CPU autocast, as `bf16` runs in eager: Inductor then prepacks
the weights in bf16 for oneDNN's bf16 (AMX or AVX-512 BF16) matmuls and fuses the casts into
the kernels around them, which eager autocast pays for op by op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig

from tuner.deploy.backends.base import BACKENDS, Backend, Logits
from tuner.deploy.backends.bf16 import cpu_bf16, export_bf16_weights
from tuner.deploy.backends.compile import INDUCTOR_KERNELS, compile_unavailable, compiled_alone
from tuner.deploy.backends.support.torch_files import export_weights, load_weights
from tuner.insight import BF16
from tuner.latency import native_bf16_unavailable


def _frozen(
    precision: Callable[[], contextlib.AbstractContextManager],
) -> Callable[[Path, DictConfig], Logits]:
    """A loader compiling the model with freezing and calling it inside `precision`."""

    def load(artifact: Path, deploy: DictConfig) -> Logits:
        compiled = compiled_alone(load_weights(artifact), options={"freezing": True})

        def logits_of(*inputs: torch.Tensor) -> torch.Tensor:
            # Freezing applies to graphs that need no gradients.
            with torch.no_grad(), precision():
                return compiled(*inputs).float()

        return logits_of

    return load


def _bf16_unavailable() -> str | None:
    return compile_unavailable() or native_bf16_unavailable()


BACKENDS.register("compile_frozen")(
    Backend(
        name="compile_frozen",
        export=export_weights,
        load=_frozen(contextlib.nullcontext),
        unavailable_reason=compile_unavailable,
        graph=None,
        no_graph_reason=INDUCTOR_KERNELS,
    )
)

BACKENDS.register("compile_frozen_bf16")(
    Backend(
        name="compile_frozen_bf16",
        export=export_bf16_weights,
        load=_frozen(cpu_bf16),
        unavailable_reason=_bf16_unavailable,
        precision=BF16,
        graph=None,
        no_graph_reason=INDUCTOR_KERNELS,
    )
)
