"""PyTorch static int8 quantisation (FX graph mode, torch.ao): weights and activations in int8,
activation ranges calibrated on batches of training inputs, batch norm folded in. The classifier
(the model's last Linear layer) stays in fp32: quantised, its logits would be clipped to the
range seen in calibration (keeping it halved the largest logit error on a digits CNN).
PyTorch's own qconfig for its x86 engine already calibrates activations to 7 bits, which keeps
int8 products from saturating on CPUs without VNNI.

The artifact is the quantised state dict as safetensors, calibrated scales and zero points
included, with the recipe and the input shape; loading quantises a freshly built float model
the same way and then fills it, so nothing is calibrated again and nothing is unpickled.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
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
    Logits,
    calibration_batches,
)
from tuner.deploy.backends.int8_dynamic import ENGINES
from tuner.deploy.backends.support.torch_files import load_quantized, save_quantized
from tuner.insight import INT8


def _engine() -> str | None:
    return next((e for e in ENGINES if e in torch.backends.quantized.supported_engines), None)


def _unavailable() -> str | None:
    if _engine() is None:
        return "this torch build has no quantized engine (x86, fbgemm, onednn or qnnpack)"
    return None


@contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        # torch.ao.quantization announces its move to torchao; FX graph mode still works here,
        # and observers warn when a rebuilt model is converted without calibration.
        warnings.simplefilter("ignore")
        yield


def _classifier(model: nn.Module) -> str | None:
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    return linears[-1] if linears else None


def _quantize(model: nn.Module, example: tuple[torch.Tensor, ...], calibration=()) -> nn.Module:
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    engine = _engine()
    assert engine is not None
    torch.backends.quantized.engine = engine
    mapping = get_default_qconfig_mapping(engine)
    classifier = _classifier(model)
    if classifier is not None:
        mapping = mapping.set_module_name(classifier, None)
    with _quiet():
        prepared = prepare_fx(model.eval(), mapping, example)
        with torch.inference_mode():
            for inputs in calibration:
                prepared(*inputs)
        return convert_fx(prepared)


def _export(model: nn.Module, ctx: ConversionContext) -> Path:
    example = ctx.example.tensors
    quantized = _quantize(copy.deepcopy(model), example, calibration_batches(ctx))
    shapes = [list(t.shape) for t in example]
    dtypes = [str(t.dtype).removeprefix("torch.") for t in example]
    artifact = ctx.workdir / "model.int8_static.safetensors"
    return save_quantized(quantized, ctx.recipe, artifact, shapes=shapes, dtypes=dtypes)


def _rebuild(model: nn.Module, saved: dict[str, Any]) -> nn.Module:
    example = tuple(
        torch.zeros(shape, dtype=getattr(torch, dtype))
        for shape, dtype in zip(saved["shapes"], saved["dtypes"], strict=True)
    )
    return _quantize(model, example)


def _load(artifact: Path, deploy: DictConfig) -> Logits:
    return load_quantized(artifact, _rebuild)


BACKENDS.register("int8_static")(
    Backend(
        name="int8_static",
        export=_export,
        load=_load,
        unavailable_reason=_unavailable,
        modalities=frozenset({"image"}),
        precision=INT8,
    )
)
