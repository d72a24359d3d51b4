"""ONNX Runtime int8 with the layers that int8 hurts most kept in fp32 (accuracy-aware mixed
precision).

Each node the dynamic int8 quantiser would quantise is scored by its sensitivity: the mean
absolute logit error, on training batches, of the model with only that node in int8. Nodes are
then kept in fp32 from the most sensitive down, as few as needed for the int8 model to agree with
fp32 on the predictions of those training batches at least `deploy.mixed.min_agreement` of the
time. Validation data plays no part: it decides the front. The point records the nodes kept in
fp32 (`deploy.fp32_nodes`) with every node's sensitivity (`deploy/notes.json`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from tuner.deploy.backends.base import ConversionContext, calibration_batches
from tuner.deploy.backends.support.fusion import read_notes, write_notes
from tuner.deploy.backends.support.onnx_export import (
    exported_onnx,
    int8_options,
    load_session,
    quiet_root_logger,
    register_onnx_backend,
)
from tuner.insight import INT8

# Op type -> the input holding the weight that ONNX Runtime's dynamic quantiser makes int8
# (a matmul's right operand, a convolution's kernel, an embedding table).
_WEIGHT_INPUT = {"MatMul": 1, "Gemm": 1, "Conv": 1, "Gather": 0}


def quantizable_nodes(path: Path) -> list[str]:
    """Names, as the dynamic quantiser's node lists take them, of the nodes it would quantise:
    matmuls, convolutions and lookups whose weight is stored in the graph."""
    import onnx

    graph = onnx.load(str(path)).graph
    weights = {initializer.name for initializer in graph.initializer}
    return [
        # The quantiser first turns a Gemm into a MatMul (and an Add) named so.
        f"{node.name}_MatMul" if node.op_type == "Gemm" else node.name
        for node in graph.node
        if node.op_type in _WEIGHT_INPUT
        and len(node.input) > _WEIGHT_INPUT[node.op_type]
        and node.input[_WEIGHT_INPUT[node.op_type]] in weights
    ]


class _Quantiser:
    """Writes int8 variants of one fp32 graph and runs them on the training batches."""

    def __init__(self, fp32: Path, ctx: ConversionContext) -> None:
        self.fp32, self.ctx = fp32, ctx
        self.batches = calibration_batches(ctx)
        self.reference = self.logits(fp32)

    def logits(self, path: Path) -> torch.Tensor:
        logits_of = load_session(path, self.ctx.deploy)
        return torch.cat([logits_of(*batch) for batch in self.batches])

    def write(self, path: Path, **nodes: Sequence[str]) -> Path:
        from onnxruntime.quantization import quantize_dynamic

        with quiet_root_logger():
            quantize_dynamic(str(self.fp32), str(path), **int8_options(self.ctx.deploy), **nodes)
        return path

    def error(self, path: Path) -> float:
        return float((self.logits(path) - self.reference).abs().mean())

    def agreement(self, path: Path) -> float:
        agree = self.logits(path).argmax(-1) == self.reference.argmax(-1)
        return float(agree.float().mean())


def _fewest_fp32(
    quantiser: _Quantiser, by_sensitivity: list[str], min_agreement: float, artifact: Path
) -> tuple[int, float]:
    """The fewest most-sensitive nodes to keep in fp32 (bisected: agreement rises as more
    are kept) for `min_agreement`; writes that model to `artifact`. Returns the count and the
    agreement reached (all nodes in fp32 when nothing less reaches it)."""
    tried: dict[int, float] = {}
    written: list[int] = []  # the count whose model `artifact` holds now

    def write(count: int) -> Path:
        if written != [count]:
            quantiser.write(artifact, nodes_to_exclude=by_sensitivity[:count])
            written[:] = [count]
        return artifact

    def agreement_keeping(count: int) -> float:
        if count not in tried:
            tried[count] = quantiser.agreement(write(count))
        return tried[count]

    low, high = 0, len(by_sensitivity)
    while low < high:
        middle = (low + high) // 2
        if agreement_keeping(middle) >= min_agreement:
            high = middle
        else:
            low = middle + 1
    reached = agreement_keeping(low)
    write(low)  # the bisection may have tried another count last
    return low, reached


def _export(model: nn.Module, ctx: ConversionContext) -> Path:
    fp32 = exported_onnx(model, ctx)
    quantiser = _Quantiser(fp32, ctx)
    probe = ctx.workdir / "model.probe.onnx"
    sensitivity = {
        node: quantiser.error(quantiser.write(probe, nodes_to_quantize=[node]))
        for node in quantizable_nodes(fp32)
    }
    probe.unlink(missing_ok=True)
    by_sensitivity = sorted(sensitivity, key=lambda node: -sensitivity[node])
    artifact = ctx.workdir / "model.mixed.onnx"
    min_agreement = float(ctx.deploy.mixed.min_agreement)
    kept, reached = _fewest_fp32(quantiser, by_sensitivity, min_agreement, artifact)
    notes = {
        "fp32_nodes": by_sensitivity[:kept],
        "int8_nodes": len(by_sensitivity) - kept,
        "train_agreement": reached,
        "sensitivity": {node: sensitivity[node] for node in by_sensitivity},
    }
    write_notes(artifact, notes)
    return artifact


# Which nodes stay fp32 follows the trained weights, and with them the speed.
# Mostly int8: the nodes kept in fp32 are the few the agreement needs.
register_onnx_backend(
    "onnxruntime_mixed", _export, describe=read_notes, graph_from_weights=True, precision=INT8
)
