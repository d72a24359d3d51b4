"""PyTorch on a CUDA GPU, for studies that deploy there (`deploy.device: cuda`).

The shipped artifact is the eager fp32 weights; loading puts them on the study's GPU and runs
them eagerly in fp32 (`cuda_eager`), under autocast in fp16 or bf16 (`cuda_fp16`, `cuda_bf16`:
matmuls and convolutions in half precision, reductions and norms in fp32), or compiled by
torch.compile (`cuda_compile`: Inductor's Triton kernels, compiled on the first call, during
conversion). Inputs come from the CPU and logits go back to it, as a served request's do, so
both moves are part of the latency. fp16 logits that overflow fail the point as non-finite
outputs; nothing falls back to another precision.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from tuner.deploy.backends.base import BACKENDS, FP16, Backend, Logits
from tuner.deploy.backends.compile import INDUCTOR_KERNELS, compiled_alone
from tuner.deploy.backends.support.torch_files import export_weights, load_weights
from tuner.insight import BF16, FP32

# The study profiles a call with PyTorch's CPU profiler, which sees a GPU call's launches and
# not its kernels.
_GPU_KERNELS = (
    "runs on a GPU: its time goes to CUDA kernels, which the CPU profiler a study runs does not see"
)


class OnGpu:
    """A model on a GPU behind the CPU-tensor interface every backend has. `device` is how the
    latency protocol knows to time it with CUDA events."""

    def __init__(
        self, forward: Logits, device: torch.device, autocast_dtype: torch.dtype | None
    ) -> None:
        self.forward, self.device, self.autocast_dtype = forward, device, autocast_dtype

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        moved = tuple(tensor.to(self.device) for tensor in inputs)
        autocast = (
            nullcontext()
            if self.autocast_dtype is None
            else torch.autocast("cuda", dtype=self.autocast_dtype)
        )
        with autocast:
            logits = self.forward(*moved)
        return logits.float().cpu()


def cuda_unavailable() -> str | None:
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA GPU on this machine"
    return None


def _bf16_unavailable() -> str | None:
    reason = cuda_unavailable()
    if reason is None and not torch.cuda.is_bf16_supported():
        return f"{torch.cuda.get_device_name()} has no bf16 support"
    return reason


def _compile_unavailable() -> str | None:
    reason = cuda_unavailable()
    if reason is None and importlib.util.find_spec("triton") is None:
        return "torch.compile on a GPU needs the triton package"
    return reason


@dataclass(frozen=True)
class _Variant:
    autocast_dtype: torch.dtype | None
    compiled: bool
    precision: str
    unavailable_reason: Callable[[], str | None]

    def load(self, artifact: Path, deploy: DictConfig) -> Logits:
        device = torch.device(str(deploy.device))
        model = load_weights(artifact).to(device)
        forward = compiled_alone(model) if self.compiled else model
        return OnGpu(forward, device, self.autocast_dtype)


_VARIANTS = {
    "cuda_eager": _Variant(None, False, FP32, cuda_unavailable),
    "cuda_fp16": _Variant(torch.float16, False, FP16, cuda_unavailable),
    "cuda_bf16": _Variant(torch.bfloat16, False, BF16, _bf16_unavailable),
    "cuda_compile": _Variant(None, True, FP32, _compile_unavailable),
}

for _name, _variant in _VARIANTS.items():
    BACKENDS.register(_name)(
        Backend(
            name=_name,
            export=export_weights,
            load=_variant.load,
            unavailable_reason=_variant.unavailable_reason,
            precision=_variant.precision,
            device="cuda",
            profile=None,
            no_profile_reason=_GPU_KERNELS,
            **({"graph": None, "no_graph_reason": INDUCTOR_KERNELS} if _variant.compiled else {}),
        )
    )
