"""Fusing an exported ONNX graph before it ships, and what a fused graph holds.

Text models go through ONNX Runtime's transformer optimizer (`optimize_model`, BERT fusions):
attention, skip connection + LayerNorm, bias + GELU, embedding + LayerNorm. It matches attention
only as explicit matmul/softmax nodes, so the model is exported with transformers' eager
attention; its default (scaled_dot_product_attention) exports as a pattern the optimizer leaves
unfused. Image models are fused by ONNX Runtime's own graph optimizer (batch norm folded into
the convolution before it, activation fused into the convolution), saved to a file, so the
graph that ships is the one that was timed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from tuner.deploy.backends.base import ConversionContext
from tuner.deploy.backends.support.onnx_export import (
    export_onnx,
    exported_onnx,
    quiet_root_logger,
    shared_graph,
)
from tuner.edits import attention_heads
from tuner.insight import graph_ops

# ONNX Runtime's own operators (its contrib domain): every one in a graph exported from PyTorch
# was put there by a fusion.
FUSED_DOMAIN = "com.microsoft"
ATTENTION_OPS = frozenset({"Attention", "QAttention", "MultiHeadAttention"})


def modality_of(ctx: ConversionContext) -> str:
    from tuner.models import MODEL_FAMILIES

    return MODEL_FAMILIES.get(str(ctx.recipe.model["family"])).modality


def fused_onnx(model: nn.Module, ctx: ConversionContext) -> Path:
    """The fused fp32 graph of `model` (left as it was), made once per model: the fp32 and the
    int8 fused backends of one trained model start from the same one (`shared_graph`)."""
    return shared_graph(ctx, "model.fused.onnx", lambda path: _fuse(model, ctx, path))


def _fuse(model: nn.Module, ctx: ConversionContext, path: Path) -> Path:
    if modality_of(ctx) == "text":
        return _fuse_transformer(model, ctx, path)
    return _fuse_by_runtime(exported_onnx(model, ctx), path)


def _fuse_transformer(model: nn.Module, ctx: ConversionContext, path: Path) -> Path:
    from onnxruntime.transformers.optimizer import optimize_model

    encoder = model.encoder
    config = encoder.config
    # Heads as the model holds them (pruned or not), each of the config's head size: ONNX
    # Runtime's fused Attention takes the heads after pruning and their total size.
    heads = attention_heads(model) or int(config.num_attention_heads)
    head_size = int(config.hidden_size) // int(config.num_attention_heads)
    own = config._attn_implementation
    encoder.set_attn_implementation("eager")
    try:
        exported = export_onnx(model, ctx, ctx.workdir / "model.eager_attention.onnx")
    finally:  # the trained model keeps its own attention for the other backends
        encoder.set_attn_implementation(own)
    # The optimizer reports each step through the root logger (INFO under Hydra's logging).
    with quiet_root_logger():
        optimized = optimize_model(
            str(exported),
            model_type="bert",
            num_heads=heads,
            hidden_size=heads * head_size,
        )
        optimized.save_model_to_file(str(path))
    return path


def _fuse_by_runtime(exported: Path, path: Path) -> Path:
    import onnxruntime as ort

    options = ort.SessionOptions()
    # Extended fusions are the ones that stay valid on any CPU (the `all` level adds layouts
    # chosen for this machine's vector width).
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(path)
    options.log_severity_level = 3
    ort.InferenceSession(str(exported), options, providers=["CPUExecutionProvider"])
    return path


def fusion_report(path: Path, modality: str) -> dict[str, Any]:
    """What was fused in the graph at `path`: fused op type -> count, and for a text model,
    whether its attention was fused (softmax nodes left over mean it was not)."""
    ops = graph_ops(path)
    fused = {op: n for (domain, op), n in sorted(ops.items()) if domain == FUSED_DOMAIN}
    report: dict[str, Any] = {"fused_ops": fused}
    if modality == "text":
        unfused_softmax = sum(n for (_, op), n in ops.items() if op == "Softmax")
        report["attention_fused"] = bool(ATTENTION_OPS & fused.keys()) and not unfused_softmax
    return report


def notes_path(artifact: Path) -> Path:
    """Where an export leaves what its artifact holds, for `Backend.describe` to read."""
    return artifact.with_name(artifact.name + ".notes.json")


def write_notes(artifact: Path, notes: dict[str, Any]) -> None:
    notes_path(artifact).write_text(json.dumps(notes, indent=1))


def read_notes(artifact: Path) -> dict[str, Any]:
    return json.loads(notes_path(artifact).read_text())
