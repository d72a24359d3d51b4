"""OpenVINO export, graph and profile, shared by the OpenVINO backends; the artifact's format
and how it is compiled and run are `tuner.serving.openvino`'s, which serving runs too.

The properties an artifact is compiled with are fixed at export, on the machine that times the
model: the latency hint, the protocol's threads and the inference precision that
`deploy.openvino.precision` resolved to (`auto`: OpenVINO's own default for this CPU, bf16 where
it has native bf16, f32 elsewhere).
"""

from __future__ import annotations

import ctypes
import json
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from torch import nn

from tuner.deploy.backends.base import (
    BACKENDS,
    Backend,
    ConversionContext,
    Logits,
    packages_missing,
    runtime_loader,
)
from tuner.deploy.backends.support.onnx_export import exported_onnx
from tuner.insight import BF16, FP32, PROFILED_RUNS, GraphDump, OpProfile
from tuner.latency import native_bf16_unavailable
from tuner.serving import openvino as openvino_serving

# `deploy.openvino.precision` -> the inference precision OpenVINO is given; `auto` is resolved
# to the CPU plugin's own default.
PRECISIONS = ("auto", "f32", "bf16")
# OpenVINO's precision names -> the arithmetic a point is judged in (its roofline's peak).
_JUDGED_AS = {"f32": FP32, "bf16": BF16}
# Nodes of a compiled model that are no operation: constants and the graph's ends.
_NOT_OPS = frozenset({"Const", "Constant", "Input", "Parameter", "Output", "Result"})


class _SignalStack(ctypes.Structure):
    """`stack_t` of sigaltstack(2)."""

    _fields_ = [
        ("ss_sp", ctypes.c_void_p),
        ("ss_flags", ctypes.c_int),
        ("ss_size", ctypes.c_size_t),
    ]


@contextmanager
def kept_signal_stack() -> Iterator[None]:
    """The thread's alternate signal stack as it was before the block, set again after it.

    Each CPU plugin instance (one per OpenVINO Core) points the thread's alternate signal stack
    at memory of its own when it is made, and back at the stack it found when it is destroyed.
    Cores destroyed out of the order they were made (NNCF makes and drops several while it
    quantises) leave it pointing at a destroyed plugin's memory; Python runs its signal handlers
    on that stack, so the next Ctrl-C or SIGTERM crashed the process instead of stopping the
    study. The stack found before the block belongs to what outlives it: Python's own
    (faulthandler) or this process's one Core."""
    libc = ctypes.CDLL(None, use_errno=True)
    before = _SignalStack()
    libc.sigaltstack(None, ctypes.byref(before))
    try:
        yield
    finally:
        libc.sigaltstack(ctypes.byref(before), None)


def bf16_missing() -> str | None:
    """Why OpenVINO's CPU plugin has no native bf16 here, or None where it has. The plugin's
    oneDNN obeys ONEDNN_MAX_CPU_ISA as PyTorch's does (below its bf16 kernels, compiling a
    model in bf16 fails), while its capabilities still list BF16: both are asked."""
    capabilities = openvino_serving.core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    if "BF16" not in capabilities:
        return f"OpenVINO's CPU plugin lists no BF16 among this CPU's capabilities ({capabilities})"
    return native_bf16_unavailable()


def inference_precision(setting: str) -> str:
    """`deploy.openvino.precision` as OpenVINO's name of a precision, `f32` or `bf16`."""
    if setting not in PRECISIONS:
        raise ValueError(f"deploy.openvino.precision={setting!r}: must be one of {PRECISIONS}")
    if setting == "auto":
        # The plugin's own default: bf16 on x86 CPUs with native bf16, f32 on other x86 ones;
        # f16 on Arm, which tuner has no peak for and so takes f32 there, as the docs say.
        default = openvino_serving.core().get_property("CPU", "INFERENCE_PRECISION_HINT")
        default = default.get_type_name()
        if default == "bf16" and bf16_missing():
            return "f32"
        return default if default in _JUDGED_AS else "f32"
    reason = bf16_missing() if setting == "bf16" else None
    if reason:
        raise ValueError(f"deploy.openvino.precision=bf16: {reason}")
    return setting


def exported_ir(model: nn.Module, ctx: ConversionContext):
    """The model as an OpenVINO model, read from its fp32 ONNX export (made once per model)."""
    return openvino_serving.core().read_model(exported_onnx(model, ctx))


def save_artifact(ov_model, directory: Path, deploy: DictConfig, notes: dict[str, Any]) -> Path:
    """`ov_model` as an artifact directory, with the properties it is compiled with resolved
    here (`compile.json`) and `notes` beside them."""
    import openvino as ov

    directory.mkdir(parents=True, exist_ok=True)
    ov.save_model(ov_model, directory / openvino_serving.GRAPH_FILE, compress_to_fp16=False)
    precision = inference_precision(str(deploy.openvino.precision))
    properties = {
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": int(deploy.latency.num_threads),
        "INFERENCE_PRECISION_HINT": precision,
    }
    settings = {
        "properties": properties,
        "openvino_version": ov.__version__,
        "notes": {"precision": _JUDGED_AS[precision], "inference_precision": precision, **notes},
    }
    (directory / openvino_serving.COMPILE_FILE).write_text(json.dumps(settings, indent=2))
    return directory


def read_notes(artifact: Path) -> dict[str, Any]:
    """What the export recorded about the artifact: the precision it computes in, and what the
    backend added (`save_artifact`)."""
    return dict(openvino_serving.read_settings(artifact)["notes"])


def add_notes(artifact: Path, notes: dict[str, Any]) -> None:
    """`notes` added to what the artifact records (`read_notes`)."""
    settings = openvino_serving.read_settings(artifact)
    settings["notes"].update(notes)
    (artifact / openvino_serving.COMPILE_FILE).write_text(json.dumps(settings, indent=2))


# A callable running the artifact as compiled at export: what serving runs.
load_compiled = runtime_loader("openvino")


def runtime_graph(artifact: Path, logits_of: Logits, example) -> GraphDump:
    """The graph the CPU plugin runs (after its own fusions), one node per executed layer, as
    its runtime model reports them: layer type, name, precision it runs in."""
    compiled = logits_of.runner.compiled
    lines, counts = [], defaultdict(int)
    for node in compiled.get_runtime_model().get_ordered_ops():
        info = node.get_rt_info()
        layer = str(info["layerType"].astype(str))
        if layer in _NOT_OPS:
            continue
        counts[layer] += 1
        precision = str(info["runtimePrecision"].astype(str)) if "runtimePrecision" in info else ""
        lines.append(f"{len(lines):4d} {layer} {node.get_friendly_name()} [{precision}]")
    return GraphDump(dict(counts), "\n".join(lines) + "\n")


def profile_compiled(artifact: Path, logits_of: Logits, example, deploy: DictConfig) -> OpProfile:
    """Calls of the artifact compiled with performance counters on: one that warms it, then
    `PROFILED_RUNS`, of which the run of median length is kept. Rows are the plugin's layer
    types (`FullyConnected`, `Softmax`, `MVN`, ...), executed layers only."""
    compiled = openvino_serving.compiled_model(artifact, profiled=True)
    request = compiled.create_infer_request()
    feeds = openvino_serving.feeds(compiled, example.tensors)
    request.infer(feeds)
    calls = []
    for _ in range(PROFILED_RUNS):
        request.infer(feeds)
        rows: dict[str, list[float]] = defaultdict(list)
        for layer in request.get_profiling_info():
            if layer.status == layer.Status.EXECUTED and layer.node_type not in _NOT_OPS:
                rows[layer.node_type].append(layer.real_time.total_seconds() * 1000)
        calls.append(OpProfile.of((op, len(ms), sum(ms)) for op, ms in rows.items()))
    return sorted(calls, key=lambda call: call.total_ms)[len(calls) // 2]


def register_openvino_backend(
    name: str,
    export: Callable[[nn.Module, ConversionContext], Path],
    precision: str,
    graph_from_weights: bool | Callable[[DictConfig], bool] = False,
    packages: tuple[str, ...] = ("onnx", "openvino"),
) -> None:
    """An OpenVINO backend: its own export, the shared compiled-model loader, graph and
    profile; `precision` as in `Backend`, where the artifact's notes do not say it; `packages`,
    what it needs installed (the ONNX export's and OpenVINO's)."""
    BACKENDS.register(name)(
        Backend(
            name=name,
            export=export,
            load=load_compiled,
            unavailable_reason=lambda: packages_missing(packages),
            describe=read_notes,
            graph_from_weights=graph_from_weights,
            graph=runtime_graph,
            profile=profile_compiled,
            precision=precision,
            runtime="openvino",
        )
    )
