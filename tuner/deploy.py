"""Deploy a trained model on a backend, check it against eager fp32, and time it.

Nothing a backend produces is trusted: accuracy is re-measured on the validation set, its
predictions are compared with the eager model's (agreement and largest logit difference), and
NaN/Inf outputs fail the point. Any error is kept on the point; the other backends go on.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.backends import BACKENDS, ConversionContext, Deployed, ExampleInputs
from tuner.data.tokens import TokenizedTexts
from tuner.latency import LatencyProtocol, LatencyResult, measure_latency
from tuner.memory import track_peak_memory
from tuner.training import accuracy, collect_logits


class BackendFailed(RuntimeError):
    """A backend is unavailable, or its conversion or outputs cannot be used."""


@dataclass(frozen=True)
class Reference:
    """The eager fp32 model's validation logits, which every backend is compared with."""

    logits: torch.Tensor
    labels: torch.Tensor

    @property
    def accuracy(self) -> float:
        return accuracy(self.logits, self.labels)


@dataclass(frozen=True)
class BackendResult:
    backend: str
    val_accuracy: float = float("nan")
    agreement: float = float("nan")
    max_logit_diff: float = float("nan")
    latency: LatencyResult | None = None
    model_size_mb: float = float("nan")
    convert_seconds: float = float("nan")
    peak_memory_mb: float = float("nan")
    error: str | None = None

    def metrics(self) -> dict[str, float]:
        """What is logged for a complete point (the contract's names first)."""
        assert self.latency is not None
        return {
            "val_accuracy": self.val_accuracy,
            "latency_ms_p50": self.latency.p50_ms,
            "latency_ms_p95": self.latency.p95_ms,
            "model_size_mb": self.model_size_mb,
            "agreement_with_eager": self.agreement,
            "max_logit_diff": self.max_logit_diff,
            "convert_seconds": self.convert_seconds,
            "peak_memory_mb": self.peak_memory_mb,
        }


def reference_of(model: nn.Module, val_data: TokenizedTexts) -> Reference:
    model.eval()
    return Reference(collect_logits(model, val_data), val_data.labels)


@contextmanager
def converted(
    backend_name: str, model: nn.Module, example: ExampleInputs, deploy_cfg: DictConfig
) -> Iterator[tuple[Deployed, float]]:
    """The model converted for one backend, and the seconds conversion took (compile or export
    included); its artifact lives until the block ends."""
    backend = BACKENDS.get(backend_name)
    reason = backend.unavailable_reason()
    if reason:
        raise BackendFailed(f"unavailable on this machine: {reason}")
    with tempfile.TemporaryDirectory() as workdir:
        started = time.perf_counter()
        deployed = backend.convert(model, ConversionContext(example, Path(workdir), deploy_cfg))
        yield deployed, time.perf_counter() - started


def check_outputs(logits: torch.Tensor, reference: Reference) -> dict[str, float]:
    """Accuracy and agreement with eager of a backend's validation logits; NaN/Inf fail."""
    if not torch.isfinite(logits).all():
        bad = int((~torch.isfinite(logits)).any(dim=-1).sum())
        raise BackendFailed(f"non-finite outputs (NaN/Inf) on {bad} of {len(logits)} examples")
    return {
        "val_accuracy": accuracy(logits, reference.labels),
        "agreement": float((logits.argmax(-1) == reference.logits.argmax(-1)).float().mean()),
        "max_logit_diff": float((logits - reference.logits).abs().max()),
    }


def deploy_on(
    backend_name: str,
    model: nn.Module,
    reference: Reference,
    val_data: TokenizedTexts,
    example: ExampleInputs,
    protocol: LatencyProtocol,
    deploy_cfg: DictConfig,
) -> BackendResult:
    """Convert, check and time `model` on one backend; failures come back as `error`."""
    try:
        with (
            track_peak_memory() as memory,
            converted(backend_name, model, example, deploy_cfg) as (deployed, seconds),
        ):
            checks = check_outputs(collect_logits(deployed.logits_of, val_data), reference)
            latency = measure_latency(deployed.logits_of, example, protocol)
            size_mb = deployed.size_mb
    except Exception as exc:  # any backend failure stays on this point
        return BackendResult(backend_name, error=f"{type(exc).__name__}: {exc}".strip())
    return BackendResult(
        backend=backend_name,
        latency=latency,
        model_size_mb=size_mb,
        convert_seconds=seconds,
        peak_memory_mb=memory.growth_mb,
        **checks,
    )
