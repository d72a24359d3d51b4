"""Deploy a trained model on a backend, check it against eager fp32, and time it.

Nothing a backend produces is trusted: accuracy is re-measured on the validation set, its
predictions are compared with the eager model's (agreement and largest logit difference), and
NaN/Inf outputs fail the point. Any error is kept on the point; the other backends go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.data import Encoded, ExampleInputs
from tuner.deploy.backends import BACKENDS, Backend, ConversionContext, Logits
from tuner.insight import GraphDump, OpProfile
from tuner.latency import LatencyProtocol, LatencyResult, measure_latency, track_peak_memory
from tuner.models import ModelRecipe
from tuner.training import accuracy, collect_logits

# A loaded artifact -> its latency, or None when the caller times it later (with other
# backends' artifacts, in interleaved rounds).
Timer = Callable[[Logits], LatencyResult | None]

# Beside the backends' own directories under a model's deployment directory: what they share
# (the exported and fused graphs the ONNX Runtime backends of one model start from).
SHARED_DIR = "shared"


class BackendFailed(RuntimeError):
    """A backend is unavailable, or its conversion or outputs cannot be used."""


T = TypeVar("T")


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
    # What deployment took: conversion, the validation pass and the latency protocol (except
    # an architecture's first measurement, timed with the other backends' artifacts in turn).
    deploy_seconds: float = float("nan")
    peak_memory_mb: float = float("nan")
    # For a backend on a GPU: the most GPU memory its tensors held while it was converted,
    # checked and timed.
    gpu_peak_memory_mb: float | None = None
    # The file one would ship; it lives in the deployment's working directory.
    artifact: Path | None = None
    # The loaded artifact, kept only while its latency is still to be measured.
    logits_of: Logits | None = None
    # What the backend says its artifact holds (`Backend.describe`), e.g. its fused operators.
    notes: dict[str, Any] = field(default_factory=dict)
    # The artifact's operator graph, or why there is none (`tuner.insight.graph`).
    graph: GraphDump | None = None
    graph_absent: str | None = None
    # One call's time by operator, or why there is none (`tuner.insight.profile`).
    profile: OpProfile | None = None
    profile_absent: str | None = None
    error: str | None = None
    # The label index it predicts for each validation example, in the data's order.
    val_predictions: list[int] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """What is logged for a complete point (the contract's names first)."""
        assert self.latency is not None
        return {
            "val_accuracy": self.val_accuracy,
            **self.latency.metrics(),
            "model_size_mb": self.model_size_mb,
            "agreement_with_eager": self.agreement,
            "max_logit_diff": self.max_logit_diff,
            "convert_seconds": self.convert_seconds,
            "deploy_seconds": self.deploy_seconds,
            "peak_memory_mb": self.peak_memory_mb,
            **(
                {}
                if self.gpu_peak_memory_mb is None
                else {"gpu_peak_memory_mb": self.gpu_peak_memory_mb}
            ),
            **({} if self.graph is None else {"layout_ops": float(self.graph.layout_ops)}),
            **({} if self.profile is None else self.profile.metrics()),
        }


def reference_of(model: nn.Module, val_data: Encoded) -> Reference:
    model.eval()
    return Reference(collect_logits(model, val_data), val_data.labels)


@dataclass(frozen=True)
class Converted:
    logits_of: Logits
    artifact: Path
    seconds: float
    # What the backend says its artifact holds (`Backend.describe`).
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def size_mb(self) -> float:
        """The artifact's size: its file, or the files of its directory (OpenVINO's)."""
        files = [self.artifact] if self.artifact.is_file() else self.artifact.rglob("*")
        return sum(path.stat().st_size for path in files if path.is_file()) / 1e6


def convert(
    backend_name: str,
    model: nn.Module,
    recipe: ModelRecipe,
    example: ExampleInputs,
    deploy_cfg: DictConfig,
    workdir: Path,
    calibration: Sequence[tuple[torch.Tensor, ...]] = (),
    shared: Path | None = None,
) -> Converted:
    """Export the model's artifact into `workdir`, load it back, and call it once. `shared`
    is the directory the backends converting this model share (`ConversionContext.shared`).

    The first call is part of conversion: it is where torch.compile compiles and ONNX Runtime
    plans its memory, costs a deployment pays once and not per request.
    """
    backend = BACKENDS.get(backend_name)
    reason = backend.unavailable_reason()
    if reason:
        raise BackendFailed(f"unavailable on this machine: {reason}")
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    artifact = backend.export(
        model, ConversionContext(example, workdir, deploy_cfg, recipe, calibration, shared)
    )
    logits_of = backend.load(artifact, deploy_cfg)
    with torch.inference_mode():
        logits_of(*example.tensors)
    seconds = time.perf_counter() - started
    return Converted(logits_of, artifact, seconds, backend.describe(artifact))


def convert_into(
    deployment: Path,
    backend_name: str,
    model: nn.Module,
    recipe: ModelRecipe,
    example: ExampleInputs,
    deploy_cfg: DictConfig,
    calibration: Sequence[tuple[torch.Tensor, ...]] = (),
) -> Converted:
    """`convert` into the backend's own directory under `deployment`, beside the one the
    model's backends share."""
    return convert(
        backend_name,
        model,
        recipe,
        example,
        deploy_cfg,
        deployment / backend_name,
        calibration,
        shared=deployment / SHARED_DIR,
    )


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
    recipe: ModelRecipe,
    reference: Reference,
    val_data: Encoded,
    example: ExampleInputs,
    protocol: LatencyProtocol,
    deploy_cfg: DictConfig,
    deployment: Path,
    calibration: Sequence[tuple[torch.Tensor, ...]] = (),
    timer: Timer | None = None,
) -> BackendResult:
    """Convert, check and time `model` on one backend, leaving its artifact in the backend's
    directory under `deployment` (`convert_into`); failures come back as `error`.

    Args:
        timer: the loaded artifact -> its latency; by default it is timed under `protocol`
            (a study passes its latency table's, `tuner.store.latency_table`). Where it gives None,
            the result's latency is None and its `logits_of` stays loaded for the caller.
    """
    started = time.perf_counter()
    gpu = _gpu_of(backend_name, deploy_cfg)
    if gpu is not None and torch.cuda.is_available():  # else conversion says it cannot run
        torch.cuda.reset_peak_memory_stats(gpu)
    try:
        with track_peak_memory() as memory:
            converted = convert_into(
                deployment, backend_name, model, recipe, example, deploy_cfg, calibration
            )
            logits = collect_logits(converted.logits_of, val_data)
            checks = check_outputs(logits, reference)
        # Timed once the memory sampler's thread has stopped: no round of the protocol, this
        # one or those timed later, runs with a sampler beside it.
        if timer is None:
            latency = measure_latency(converted.logits_of, example, protocol)
        else:
            latency = timer(converted.logits_of)
    except Exception as exc:  # any backend failure stays on this point
        return BackendResult(backend_name, error=f"{type(exc).__name__}: {exc}".strip())
    return BackendResult(
        backend=backend_name,
        latency=latency,
        model_size_mb=converted.size_mb,
        convert_seconds=converted.seconds,
        deploy_seconds=time.perf_counter() - started,
        peak_memory_mb=memory.growth_mb,
        gpu_peak_memory_mb=None if gpu is None else torch.cuda.max_memory_allocated(gpu) / 2**20,
        artifact=converted.artifact,
        logits_of=converted.logits_of if latency is None else None,
        notes=converted.notes,
        val_predictions=logits.argmax(-1).tolist(),
        **_where_time_goes(backend_name, converted, example, deploy_cfg),
        **checks,
    )


def _where_time_goes(
    backend_name: str, converted: Converted, example: ExampleInputs, deploy_cfg: DictConfig
) -> dict[str, Any]:
    """The artifact's graph and profile, each with why it is absent where it is. Read and
    profiled apart from the timed calls (after them, or before the rounds a latency table times
    later), so that neither ever touches them."""
    backend = BACKENDS.get(backend_name)
    graph, graph_absent = graph_of(backend, converted.artifact, converted.logits_of, example)
    profile, profile_absent = profile_of(
        backend, converted.artifact, converted.logits_of, example, deploy_cfg
    )
    return {
        "graph": graph,
        "graph_absent": graph_absent,
        "profile": profile,
        "profile_absent": profile_absent,
    }


def _gpu_of(backend_name: str, deploy_cfg: DictConfig) -> torch.device | None:
    """The GPU a backend deploys on (the study's `deploy.device`), or None for a CPU one."""
    if BACKENDS.get(backend_name).device != "cuda":
        return None
    return torch.device(str(deploy_cfg.device))


def graph_of(
    backend: Backend, artifact: Path, logits_of: Logits, example: ExampleInputs
) -> tuple[GraphDump | None, str | None]:
    """The artifact's operator graph, or None and the reason there is none."""
    if backend.graph is None:
        return None, f"{backend.name} {backend.no_graph_reason}"
    graph = backend.graph
    return _or_reason(lambda: graph(artifact, logits_of, example))


def profile_of(
    backend: Backend,
    artifact: Path,
    logits_of: Logits,
    example: ExampleInputs,
    deploy_cfg: DictConfig,
) -> tuple[OpProfile | None, str | None]:
    """One call's time by operator, or None and the reason there is none."""
    if backend.profile is None:
        return None, f"{backend.name} {backend.no_profile_reason}"
    profile = backend.profile
    return _or_reason(lambda: profile(artifact, logits_of, example, deploy_cfg))


def _or_reason(read: Callable[[], T]) -> tuple[T | None, str | None]:
    """What `read` gives, or None and why it failed: a graph dump or a profile that fails
    leaves the point as it is."""
    try:
        return read(), None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}".strip()
