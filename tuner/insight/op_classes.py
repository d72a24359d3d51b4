"""A small fixed set of operator classes, and the class of each operator type a deployed graph
holds (ONNX and ONNX Runtime op types, PyTorch aten names, OpenVINO CPU layer types).

The classes answer "where does the time go" in the terms people tune by: the matmuls and
convolutions that do the arithmetic, attention, normalisation, activations, other element-wise
work, pooling, memory and layout operations (transposes, copies, reshapes, concatenation,
slicing, gathers, format conversions) and quantize/dequantize steps. An op type not listed is
`other`, so an unknown operator is counted, never dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

MATMUL = "matmul/conv"
ATTENTION = "attention"
NORM = "norm"
ACTIVATION = "activation"
ELEMENTWISE = "elementwise"
POOLING = "pooling"
LAYOUT = "layout/memory"
QUANTIZE = "quantize"
OTHER = "other"

OP_CLASSES = (MATMUL, ATTENTION, NORM, ACTIVATION, ELEMENTWISE, POOLING, LAYOUT, QUANTIZE, OTHER)

_MEMBERS: dict[str, frozenset[str]] = {
    MATMUL: frozenset(
        {
            # ONNX and ONNX Runtime
            "MatMul", "Gemm", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
            "QLinearMatMul", "QGemm", "FusedMatMul", "FusedGemm", "Conv", "ConvInteger",
            "QLinearConv", "FusedConv", "NhwcFusedConv", "ConvTranspose",
            # PyTorch
            "linear", "mm", "bmm", "addmm", "matmul", "baddbmm", "conv2d", "convolution",
            "_convolution", "mkldnn_convolution", "quantized_linear", "linear_dynamic",
            "conv2d_relu", "quantized_conv2d",
            # OpenVINO's CPU plugin
            "FullyConnected", "FullyConnectedQuantizedLegacy", "Convolution", "GroupConvolution",
        }
    ),
    ATTENTION: frozenset(
        {
            "Attention", "QAttention", "MultiHeadAttention", "Softmax",
            "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
            "softmax", "_softmax",
            # OpenVINO's CPU plugin
            "ScaledDotProductAttention", "SDPA",
        }
    ),
    NORM: frozenset(
        {
            "LayerNormalization", "SkipLayerNormalization", "EmbedLayerNormalization",
            "QEmbedLayerNormalization", "SimplifiedLayerNormalization", "BatchNormalization",
            "layer_norm", "native_layer_norm", "batch_norm", "native_batch_norm",
            "_native_batch_norm_legit_no_training",
            # OpenVINO's CPU plugin
            "MVN", "RMS",
        }
    ),
    ACTIVATION: frozenset(
        {
            "Gelu", "BiasGelu", "FastGelu", "Relu", "Tanh", "Erf", "Sigmoid", "Clip",
            "gelu", "relu", "relu_", "tanh", "sigmoid", "hardtanh",
        }
    ),
    ELEMENTWISE: frozenset(
        {
            "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Neg", "Where", "Equal", "Not", "Less",
            "Greater", "And", "Or", "ReduceMean", "ReduceSum", "Max", "Min", "Abs", "Exp",
            "add", "add_", "sub", "rsub", "mul", "div", "pow", "sqrt", "neg", "where", "eq",
            "masked_fill", "mean", "sum", "exp", "clamp", "clamp_min",
            # OpenVINO's CPU plugin (element-wise layers by what they compute, and `Eltwise`)
            "Eltwise", "Multiply", "Subtract", "Divide", "MulAdd", "Select", "IsNaN", "Power",
            "PowerStatic", "GreaterEqual", "ReduceProd", "Reduce",
        }
    ),
    POOLING: frozenset(
        {
            "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Pooling",
            "max_pool2d", "max_pool2d_with_indices", "avg_pool2d", "adaptive_avg_pool2d",
        }
    ),
    LAYOUT: frozenset(
        {
            "Transpose", "Reshape", "Concat", "Slice", "Gather", "Split", "Squeeze",
            "Unsqueeze", "Expand", "Flatten", "Shape", "Identity", "Tile", "Pad", "Cast",
            "ConstantOfShape", "Range", "ReorderInput", "ReorderOutput",
            "transpose", "permute", "view", "reshape", "_unsafe_view", "contiguous", "clone",
            "copy_", "_to_copy", "to", "cat", "slice", "select", "index_select", "embedding",
            "gather",
            "expand", "unsqueeze", "squeeze", "flatten", "split", "t", "as_strided",
            "to_mkldnn", "to_dense",
            # OpenVINO's CPU plugin
            "Reorder", "Concatenation", "StridedSlice", "Convert", "ShapeOf", "Broadcast",
            "GatherElements",
        }
    ),
    QUANTIZE: frozenset(
        {
            "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
            "quantize_per_tensor", "quantize_per_tensor_dynamic", "dequantize",
            "FakeQuantize",
        }
    ),
}  # fmt: skip

_CLASS_OF: Mapping[str, str] = {op: name for name, ops in _MEMBERS.items() for op in ops}


def op_class(op_type: str) -> str:
    """The class of an op type: an ONNX op type (`MatMul`), an ONNX Runtime contrib op
    (`QAttention`) or a PyTorch operator, with or without its namespace and overload
    (`aten::linear`, `aten.addmm.default`, `quantized.linear_dynamic`)."""
    name = op_type.rsplit("::", 1)[-1]
    if "." in name:  # `namespace.op` or `namespace.op.overload`; ONNX op types have no dots
        name = name.split(".")[1]
    return _CLASS_OF.get(name, OTHER)


def by_class(counts: Iterable[tuple[str, float]]) -> dict[str, float]:
    """(op type, amount) pairs summed per class, every class listed in `OP_CLASSES` order."""
    totals = dict.fromkeys(OP_CLASSES, 0.0)
    for op_type, amount in counts:
        totals[op_class(op_type)] += amount
    return totals
