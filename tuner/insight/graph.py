"""The operator graph of what ships: op counts by type and class, the count of layout and memory
ops, and a readable listing, for the point's MLflow run (`graph/ops.json`, `graph/graph.txt`,
metric `layout_ops`).

An ONNX artifact's graph is read from its file. A PyTorch artifact has no graph file: its graph
is traced from one call of the loaded artifact (under inference mode), as the operators it
dispatches in order, each as called (`aten.linear`, not the matmul it runs), quantized kernels
included."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tuner.insight.op_classes import LAYOUT, by_class, op_class


@dataclass(frozen=True)
class GraphDump:
    """An artifact's operators.

    Attributes:
        ops: op type -> node count.
        text: one line per node, in graph order: op type, name, inputs -> outputs.
    """

    ops: dict[str, int]
    text: str

    @property
    def layout_ops(self) -> int:
        """Transposes, reshapes, copies, concatenations, slices, gathers, casts and layout
        conversions: operators that move data rather than compute on it."""
        return int(by_class(self.ops.items())[LAYOUT])

    def summary(self) -> dict[str, Any]:
        """What `graph/ops.json` holds."""
        return {
            "nodes": sum(self.ops.values()),
            "layout_ops": self.layout_ops,
            "by_class": {name: int(n) for name, n in by_class(self.ops.items()).items() if n},
            "ops": {op: {"count": n, "class": op_class(op)} for op, n in sorted(self.ops.items())},
        }


def _nodes(path: Path):
    """The nodes of the top-level ONNX graph in `path`, as ONNX Runtime runs them."""
    import onnx

    return onnx.load(str(path), load_external_data=False).graph.node


def graph_ops(path: Path) -> Counter[tuple[str, str]]:
    """(domain, op type) -> node count of the ONNX graph in `path`."""
    return Counter((node.domain or "ai.onnx", node.op_type) for node in _nodes(path))


def onnx_graph(path: Path) -> GraphDump:
    """The dump of the ONNX graph in `path`."""
    nodes = _nodes(path)
    lines = [
        f"{i:4d} {node.op_type}{'' if not node.domain else f' ({node.domain})'} {node.name}: "
        f"{', '.join(node.input)} -> {', '.join(node.output)}"
        for i, node in enumerate(nodes)
    ]
    return GraphDump(dict(Counter(node.op_type for node in nodes)), "\n".join(lines) + "\n")


class _Dispatched(TorchDispatchMode):
    """Records every operator dispatched while active, with its tensors' shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls.append((str(func), _shapes(args), _shapes((out,))))
        return out


def _shapes(values) -> str:
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append("x".join(map(str, value.shape)) or "scalar")
        elif isinstance(value, (list, tuple)):
            found += [s for s in _shapes(value).split(", ") if s]
    return ", ".join(found)


def dispatched_graph(logits_of, tensors: tuple[torch.Tensor, ...]) -> GraphDump:
    """The dump of the operators one call of a loaded PyTorch artifact dispatches: op type
    `namespace.op` (`aten.addmm`, `quantized.linear_dynamic`), its input and output shapes."""
    recorder = _Dispatched()
    with torch.inference_mode(), recorder:
        logits_of(*tensors)
    names = [func.rsplit(".", 1)[0] for func, _, _ in recorder.calls]
    lines = [
        f"{i:4d} {name}: {inputs} -> {outputs}"
        for i, (name, (_, inputs, outputs)) in enumerate(zip(names, recorder.calls, strict=True))
    ]
    return GraphDump(dict(Counter(names)), "\n".join(lines) + "\n")
