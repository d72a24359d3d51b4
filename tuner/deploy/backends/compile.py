"""torch.compile (Inductor) over the shipped eager model, with the sizes that change between calls
compiled dynamic.

Compiling happens on the first call, which deployment makes during conversion, so compile time
counts as conversion and not as latency.
"""

from __future__ import annotations

import shutil
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.deploy.backends.base import BACKENDS, Backend, Logits
from tuner.deploy.backends.support.torch_files import export_weights, load_weights

# Why the compiled backends' points have no operator graph.
INDUCTOR_KERNELS = (
    "runs code Inductor generates when the artifact is loaded: its kernels are no operator "
    "graph to dump"
)


def compile_unavailable() -> str | None:
    if not any(shutil.which(compiler) for compiler in ("c++", "g++", "clang++")):
        return "Inductor needs a C++ compiler (c++, g++ or clang++) on PATH"
    return None


def compiled_alone(model: nn.Module, **settings: Any) -> Callable[..., torch.Tensor]:
    """`torch.compile(model, **settings)`, its compiled code kept for this model alone, with
    the batch symbolic and Dynamo's automatic dynamic shapes for the other sizes.

    The batch (the first dimension of every input) varies between calls wherever a model is
    served, so it is symbolic from the first call of more than one example: a served model's
    first batched request compiles a graph later batches reuse, not one for its own size alone
    and another at the next request. A batch of one is compiled for apart (Dynamo specialises
    sizes 0 and 1). Another size compiles as its first call had it, and symbolic from the first
    call that changes it (a text's length), once. Sizes that never change, an image's height
    and width, stay constants: Inductor then indexes its kernels by plain numbers instead of
    symbolic expressions, and compiles an image model in 30-50% less time.

    Dynamo files compiled code under the Python code object it compiled, and compiling a model
    compiles its class's `forward`, which every model of the family shares: each architecture a
    process loads (two or three entries each: its first shapes, then symbolic sizes) adds to the
    same list. Past `torch._dynamo.config.recompile_limit` (8) entries Dynamo runs every further
    model eagerly, with a warning and no error, so a long study's later compiled points would
    time eager code; before that, each call checks the earlier models' guards first. Compiling a
    function with a code object of its own per model keeps its entries with it, and they go when
    it goes. Which sizes have changed Dynamo keeps apart, for the whole process, under the
    function's file, first line and name; the function is named for the model's class. The
    models of one family (a study's) then share what changed: a text's length varies for every
    model of a text study, and from the second model on it compiles symbolic at once, not after
    a compile for the first length. Another family's sizes stay apart: an image's height and
    width, constant for every model of an image study, do not compile symbolic because a text
    model's inputs (or another family's images) had other sizes earlier in the process."""

    def call(*inputs: torch.Tensor) -> torch.Tensor:
        return model(*inputs)

    family = type(model)
    code = call.__code__.replace(co_name=f"call_{family.__module__}.{family.__qualname__}")
    own = types.FunctionType(code, call.__globals__, code.co_name, None, call.__closure__)
    compiled = torch.compile(own, **settings)
    batched = False

    def any_batch(*inputs: torch.Tensor) -> torch.Tensor:
        # Marked on the first batched call only: the graph it compiles takes every later batch,
        # and marking costs some 20 us a tensor, on the path latencies are timed on.
        nonlocal batched
        if not batched and inputs[0].shape[0] > 1:
            for tensor in inputs:
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
            batched = True
        return compiled(*inputs)

    return any_batch


def _load(artifact: Path, deploy: DictConfig) -> Logits:
    return compiled_alone(load_weights(artifact), mode=str(deploy.compile.mode))


BACKENDS.register("compile")(
    Backend(
        name="compile",
        export=export_weights,
        load=_load,
        unavailable_reason=compile_unavailable,
        graph=None,
        no_graph_reason=INDUCTOR_KERNELS,
    )
)
