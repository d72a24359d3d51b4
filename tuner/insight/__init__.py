"""What makes a deployed model fast or slow: its operators by class, its graph, its layout ops."""

from tuner.insight.graph import GraphDump, dispatched_graph, graph_ops, onnx_graph
from tuner.insight.op_classes import OP_CLASSES, op_class
from tuner.insight.point import PointInsight
from tuner.insight.profile import PROFILED_RUNS, OpProfile, profile_onnx, profile_torch
from tuner.insight.roofline import (
    BF16,
    FP32,
    INT8,
    PRECISIONS,
    MachinePeak,
    peak_key,
    roofline,
    stored_peaks,
)

__all__ = [
    "BF16",
    "FP32",
    "GraphDump",
    "INT8",
    "MachinePeak",
    "OP_CLASSES",
    "OpProfile",
    "PRECISIONS",
    "PROFILED_RUNS",
    "PointInsight",
    "dispatched_graph",
    "graph_ops",
    "onnx_graph",
    "op_class",
    "peak_key",
    "profile_onnx",
    "profile_torch",
    "roofline",
    "stored_peaks",
]
