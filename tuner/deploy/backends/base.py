"""What a backend is: an availability check, an export of the trained model to the artifact one
ships, and a loader that runs that artifact.

Deployment always goes through both halves (export, then load), so the model whose accuracy and
latency are measured is the artifact that is logged and shipped, not an in-memory stand-in.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.data import ExampleInputs
from tuner.insight import (
    BF16,
    FP32,
    PRECISIONS,
    GraphDump,
    OpProfile,
    dispatched_graph,
    profile_torch,
)
from tuner.models import ModelRecipe
from tuner.registry import Registry
from tuner.serving import RUNTIMES

# Model inputs (token ids and attention mask, or images) -> logits.
Logits = Callable[..., torch.Tensor]

FP16 = "fp16"
# What a backend may compute in, by the kind of device it deploys on: on the CPU, the
# precisions a study measures the machine's peaks for (its roofline); on a GPU also fp16 (GPU
# points get no roofline: the peaks measured are the CPU's).
DEVICE_PRECISIONS = {"cpu": PRECISIONS, "cuda": (FP32, BF16, FP16)}


@dataclass(frozen=True)
class ConversionContext:
    """What a conversion may use: example inputs, a scratch directory, the `deploy` config,
    the model's recipe (PyTorch artifacts ship it beside their weights), batches of training
    inputs for backends that calibrate activation ranges (static int8), and a directory shared
    by the backends converting this same model under the same `deploy` config, where one keeps
    what others can start from (an exported or fused graph) instead of making it again; None
    where nothing is shared."""

    example: ExampleInputs
    workdir: Path
    deploy: DictConfig
    recipe: ModelRecipe
    calibration: Sequence[tuple[torch.Tensor, ...]] = ()
    shared: Path | None = None


@dataclass(frozen=True)
class Backend:
    """A deployment target.

    Attributes:
        export: trained eager fp32 model -> the artifact file one ships (in `ctx.workdir`);
            must not modify the model.
        load: artifact + the `deploy` config -> a callable returning logits; what serving runs.
        unavailable_reason: why this machine cannot run the backend, or None when it can.
        modalities: the input modalities whose models it deploys (`tuner.modalities`).
        describe: artifact -> what it holds that the point should record (JSON values, e.g.
            the fused operators); logged as `deploy.<name>` tags and `deploy/notes.json`.
        graph_from_weights: the artifact's graph depends on the trained weights (which nodes
            stay fp32, say), so its latency is not the architecture's: each artifact is timed
            on its own after training, and the study's latency table does not keep it. A
            function of the `deploy` config where a setting decides it (`follows_weights`).
        graph: (artifact, its loaded callable, example inputs) -> its operator graph
            (`tuner.insight.graph`): the operators one call dispatches unless the backend ships
            a graph file to read; None where there is no operator graph to dump, with the
            reason in `no_graph_reason`.
        no_graph_reason: why a backend without `graph` has none (recorded on its points).
        precision: what its matmuls and convolutions compute in (`fp32`, `bf16`, `int8`, and
            on a GPU `fp16`): the machine peak its roofline is drawn against
            (`tuner.insight.roofline`). A backend whose arithmetic follows a setting says
            which it took as `precision` in what `describe` returns, which wins.
        profile: (artifact, its loaded callable, example inputs, `deploy` config) -> one
            call's time by operator (`tuner.insight.profile`); PyTorch's profiler on the
            loaded callable unless the backend has a profiler of its own; None where no
            profile is taken, with the reason in `no_profile_reason`.
        no_profile_reason: why a backend without `profile` has none (recorded on its points).
        device: the kind of device its artifact runs on, `cpu` or `cuda` (`deploy.device`
            chooses which kind a study deploys on). A `cuda` backend's loaded callable takes
            and gives CPU tensors, as serving calls it, and has a `device` attribute, the GPU
            it runs on, by which the latency protocol times it with CUDA events.
        runtime: the runtime of `tuner.serving` that runs its artifacts without PyTorch (its
            `load` is then `runtime_loader(runtime)`, so that what is served is what was
            measured), or None where the artifact runs on PyTorch. Its logged models require
            that runtime and not PyTorch.
    """

    name: str
    export: Callable[[nn.Module, ConversionContext], Path]
    load: Callable[[Path, DictConfig], Logits]
    unavailable_reason: Callable[[], str | None] = lambda: None
    modalities: frozenset[str] = frozenset({"text", "image"})
    describe: Callable[[Path], dict[str, Any]] = lambda artifact: {}
    graph_from_weights: bool | Callable[[DictConfig], bool] = False
    graph: Callable[[Path, Logits, ExampleInputs], GraphDump] | None = (
        lambda artifact, logits_of, example: dispatched_graph(logits_of, example.tensors)
    )
    no_graph_reason: str | None = None
    profile: Callable[[Path, Logits, ExampleInputs, DictConfig], OpProfile] | None = (
        lambda artifact, logits_of, example, deploy: profile_torch(logits_of, example.tensors)
    )
    no_profile_reason: str | None = None
    precision: str = FP32
    device: str = "cpu"
    runtime: str | None = None

    def follows_weights(self, deploy: DictConfig) -> bool:
        """Whether, under these `deploy` settings, the artifact's graph follows the trained
        weights (`graph_from_weights`)."""
        rule = self.graph_from_weights
        return bool(rule(deploy) if callable(rule) else rule)

    def __post_init__(self) -> None:
        if self.device not in DEVICE_PRECISIONS:
            raise ValueError(
                f"backend {self.name!r}: device {self.device!r} is not one of "
                f"{', '.join(DEVICE_PRECISIONS)}"
            )
        precisions = DEVICE_PRECISIONS[self.device]
        if self.precision not in precisions:
            raise ValueError(
                f"backend {self.name!r}: precision {self.precision!r} is not one of "
                f"{', '.join(precisions)} (the {self.device} precisions a point can be judged in)"
            )
        if (self.graph is None) != (self.no_graph_reason is not None):
            raise ValueError(
                f"backend {self.name!r}: a backend names either how to read its graph or why "
                "it has none (`graph` or `no_graph_reason`), not both or neither"
            )
        if (self.profile is None) != (self.no_profile_reason is not None):
            raise ValueError(
                f"backend {self.name!r}: a backend names either how to profile a call or why "
                "it takes no profile (`profile` or `no_profile_reason`), not both or neither"
            )


BACKENDS: Registry[Backend] = Registry("deploy.backend")


def unavailable_backends(names: Sequence[str]) -> dict[str, str]:
    """Of the backends `names`, those this machine cannot run, each with its reason."""
    reasons = {name: BACKENDS.get(name).unavailable_reason() for name in names}
    return {name: reason for name, reason in reasons.items() if reason}


def packages_missing(packages: Sequence[str]) -> str | None:
    """Why a backend needing `packages` cannot run here, or None where they are installed."""
    for package in packages:
        if importlib.util.find_spec(package) is None:
            return f"the `{package}` package is not installed"
    return None


def runtime_loader(runtime: str) -> Callable[[Path, DictConfig], Logits]:
    """The loader of a backend whose artifacts `runtime` serves: the runner serving loads,
    with tensors in and out (kept as the callable's `runner`, for what reads the runtime's own
    objects)."""

    def load(artifact: Path, deploy: DictConfig) -> Logits:
        runner = RUNTIMES.get(runtime).load(artifact, deploy)

        def logits_of(*tensors: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(runner(*(tensor.numpy() for tensor in tensors)))

        logits_of.runner = runner
        return logits_of

    return load


def calibration_batches(ctx: ConversionContext) -> Sequence[tuple[torch.Tensor, ...]]:
    """The calibration batches, or a clear failure for a backend that needs them."""
    if not ctx.calibration:
        raise ValueError("this backend needs calibration batches of training inputs")
    return ctx.calibration
