"""ONNX Runtime on its CPU execution provider, with the latency protocol's threads."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tuner.serving.runtime import RUNTIMES, Runner, Runtime

_NUMPY_TYPES = {"tensor(int64)": np.int64, "tensor(float)": np.float32}

Feeds = Callable[[Sequence[Any]], dict[str, np.ndarray]]


def open_session(
    path: Path, deploy: Mapping[str, Any], profile_prefix: str | None = None
) -> tuple[Any, Feeds]:
    """An ONNX Runtime CPU session on the ONNX file, with `deploy.latency.num_threads` (profiling
    into files named `profile_prefix*` when given), and a function turning the model's inputs
    (arrays, or anything numpy reads as one) into its feeds."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = int(deploy["latency"]["num_threads"])
    options.inter_op_num_threads = 1
    # Whether idle intra-op threads busy-wait for the next call or sleep. Points logged before
    # the setting existed were timed with ONNX Runtime's default, spinning, and are served so.
    spinning = "1" if deploy["onnx"].get("allow_spinning", True) else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    options.log_severity_level = 3
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    # The graph's inputs in the order the model takes them, with the dtype each expects.
    inputs = [(i.name, _NUMPY_TYPES[i.type]) for i in session.get_inputs()]

    def feeds_of(arrays: Sequence[Any]) -> dict[str, np.ndarray]:
        return {
            name: np.asarray(array).astype(dtype, copy=False)
            for (name, dtype), array in zip(inputs, arrays, strict=True)
        }

    return session, feeds_of


def load_session(path: Path, deploy: Mapping[str, Any]) -> Runner:
    """A runner of the ONNX file in ONNX Runtime's CPU provider."""
    session, feeds_of = open_session(path, deploy)

    def logits_of(*arrays: np.ndarray) -> np.ndarray:
        return session.run(None, feeds_of(arrays))[0]

    return logits_of


RUNTIMES.register("onnxruntime")(Runtime(load=load_session, packages=("onnxruntime",)))
