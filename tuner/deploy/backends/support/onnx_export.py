"""ONNX export, shared by the ONNX Runtime and OpenVINO backends; ONNX Runtime sessions are
`tuner.serving.onnxruntime`'s, which serving opens too."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.deploy.backends.base import (
    BACKENDS,
    Backend,
    ConversionContext,
    packages_missing,
    runtime_loader,
)
from tuner.insight import FP32, onnx_graph, profile_onnx
from tuner.latency import has_vnni
from tuner.serving import onnxruntime as onnxruntime_serving


def export_onnx(model: nn.Module, ctx: ConversionContext, path: Path) -> Path:
    """TorchScript-based export with the example's dynamic axes (batch, sequence length)."""
    example = ctx.example
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about data-dependent Python values
        torch.onnx.export(
            model.eval(),
            example.tensors,
            str(path),
            input_names=list(example.names),
            output_names=["logits"],
            dynamic_axes={**example.dynamic_axes, "logits": {0: "batch"}},
            opset_version=int(ctx.deploy.onnx.opset),
            dynamo=False,
        )
    return path


def shared_graph(ctx: ConversionContext, name: str, make: Callable[[Path], Path]) -> Path:
    """The graph `make(path)` writes, made once per model: in `ctx.shared`, where the first
    backend to need it leaves it for the others (written under a temporary name and renamed,
    so a failure leaves no half-written graph to reuse); without one, in a directory of the
    backend's own."""
    directory = ctx.shared if ctx.shared is not None else ctx.workdir / "intermediate"
    path = directory / name
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        partial = directory / f"partial.{name}"
        try:
            make(partial).rename(path)
        finally:
            partial.unlink(missing_ok=True)
    return path


def exported_onnx(model: nn.Module, ctx: ConversionContext) -> Path:
    """The model's plain fp32 ONNX export, made once per model (`shared_graph`)."""
    return shared_graph(ctx, "model.fp32.onnx", lambda path: export_onnx(model, ctx, path))


def int8_options(deploy: DictConfig) -> dict[str, Any]:
    """The `deploy.onnx.int8` settings as ONNX Runtime's quantisers take them.

    `reduce_range: auto` quantises weights to 7 bits exactly where this CPU has no VNNI
    instructions: there ONNX Runtime's u8s8 kernels add pairs of products in 16 bits, which
    saturate with full 8-bit weights; with VNNI (or AMX) they accumulate in 32 bits and the
    eighth bit is free accuracy.
    """
    from onnxruntime.quantization import QuantType

    settings = deploy.onnx.int8
    reduce_range = settings.reduce_range
    return {
        "reduce_range": not has_vnni() if reduce_range == "auto" else bool(reduce_range),
        "weight_type": {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}[
            str(settings.weight_type)
        ],
        "per_channel": bool(settings.per_channel),
    }


def output_nodes(path: Path) -> list[str]:
    """The names of the nodes that compute the graph's outputs (the logits)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    outputs = {output.name for output in graph.output}
    return [node.name for node in graph.node if outputs & set(node.output)]


@contextmanager
def quiet_root_logger() -> Iterator[None]:
    """ONNX Runtime's quantisers advise pre-processing through the root logger on every call."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


# A callable running an ONNX file in ONNX Runtime's CPU provider: what serving runs.
load_session = runtime_loader("onnxruntime")


def profile_session(path: Path, deploy: DictConfig, tensors: tuple[torch.Tensor, ...]):
    """One call of the ONNX file, profiled by ONNX Runtime in a session of its own."""
    return profile_onnx(
        lambda artifact, prefix: onnxruntime_serving.open_session(artifact, deploy, prefix),
        path,
        tensors,
    )


def register_onnx_backend(
    name: str,
    export: Callable[[nn.Module, ConversionContext], Path],
    modalities: frozenset[str] = frozenset({"text", "image"}),
    describe: Callable[[Path], dict[str, Any]] = lambda artifact: {},
    graph_from_weights: bool = False,
    precision: str = FP32,
) -> None:
    """An ONNX Runtime backend: its own export, the shared session loader and availability;
    `precision` as in `Backend`."""
    BACKENDS.register(name)(
        Backend(
            name=name,
            export=export,
            load=load_session,
            unavailable_reason=lambda: packages_missing(("onnx", "onnxruntime")),
            modalities=modalities,
            describe=describe,
            graph_from_weights=graph_from_weights,
            graph=lambda artifact, logits_of, example: onnx_graph(artifact),
            runtime="onnxruntime",
            precision=precision,
            profile=lambda artifact, logits_of, example, deploy: profile_session(
                artifact, deploy, example.tensors
            ),
        )
    )
