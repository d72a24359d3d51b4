"""PyTorch dynamic int8 quantisation: Linear weights in int8, activations quantised per call."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from tuner.backends.base import BACKENDS, Backend, ConversionContext, Deployed

ENGINES = ("x86", "fbgemm", "onednn", "qnnpack")


def _unavailable() -> str | None:
    if not set(ENGINES) & set(torch.backends.quantized.supported_engines):
        return "this torch build has no quantized engine (x86, fbgemm, onednn or qnnpack)"
    return None


def _convert(model: nn.Module, ctx: ConversionContext) -> Deployed:
    with warnings.catch_warnings():
        # torch.ao.quantization announces its move to torchao; the API still works here.
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(
            model.eval(), {nn.Linear}, dtype=torch.qint8, inplace=False
        )
    artifact = ctx.workdir / "model.int8.pt"
    torch.save(quantized.state_dict(), artifact)
    return Deployed(logits_of=quantized, artifact=artifact)


BACKENDS.register("int8_dynamic")(
    Backend(name="int8_dynamic", convert=_convert, unavailable_reason=_unavailable)
)
