"""OpenVINO's CPU plugin, compiling an artifact with the properties it was timed with.

An OpenVINO artifact is a directory: the model in OpenVINO's own format (`model.xml`, its graph,
and `model.bin`, its weights) and `compile.json`, the properties it is compiled with and what
the export found out about it. The properties are fixed at export, on the machine that times
the model, and serving compiles with exactly those (the latency hint, the protocol's threads,
the inference precision): a model served on another machine is the model that was measured, not
one OpenVINO picked again for that machine.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from tuner.serving.runtime import RUNTIMES, Runner, Runtime

GRAPH_FILE = "model.xml"
COMPILE_FILE = "compile.json"


@cache
def core():
    """The process's one OpenVINO Core, kept for its life: each Core's CPU plugin sets the
    thread's alternate signal stack, and one that outlives every use leaves it in place."""
    import openvino as ov

    return ov.Core()


def read_settings(artifact: Path) -> dict[str, Any]:
    """`compile.json`: the properties, the OpenVINO version that wrote it, and its notes."""
    return json.loads((artifact / COMPILE_FILE).read_text())


def compiled_model(artifact: Path, profiled: bool = False):
    """The artifact compiled on the CPU plugin with the properties it was exported with."""
    properties = dict(read_settings(artifact)["properties"])
    if profiled:
        properties["PERF_COUNT"] = True
    return core().compile_model(core().read_model(artifact / GRAPH_FILE), "CPU", properties)


def feeds(compiled, arrays: Sequence[Any]) -> dict[str, np.ndarray]:
    """The model's inputs (arrays, or anything numpy reads as one) by its input names."""
    return {
        port.get_any_name(): np.asarray(array)
        for port, array in zip(compiled.inputs, arrays, strict=True)
    }


def load_compiled(artifact: Path, deploy: Mapping[str, Any]) -> Runner:
    """A runner of the artifact as compiled at export (`deploy` plays no part: the properties
    are the artifact's). One inference request serves every call; a lock keeps calls from
    threads of a server apart (a request runs one at a time)."""
    compiled = compiled_model(artifact)
    request = compiled.create_infer_request()
    lock = threading.Lock()

    def logits_of(*arrays: np.ndarray) -> np.ndarray:
        with lock:
            outputs = request.infer(feeds(compiled, arrays))
            # The request reuses its output buffer on the next call.
            return np.array(outputs[0], copy=True)

    # What deployment's graph dump reads, instead of compiling the artifact again.
    logits_of.compiled = compiled
    return logits_of


RUNTIMES.register("openvino")(Runtime(load=load_compiled, packages=("openvino",)))
