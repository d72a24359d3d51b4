"""OpenVINO int8 by NNCF's post-training quantisation: activation ranges calibrated on training
batches, weights quantised per channel, with NNCF's transformer rules for text models (which
matmuls and which of their inputs to quantise, SmoothQuant). Layers NNCF leaves unquantised
compute in the precision of `deploy.openvino.precision`.

With `deploy.openvino.accuracy_control`, NNCF's accuracy-controlled quantisation puts the most
sensitive layers back in higher precision, one at a time, until the int8 model agrees with the
fp32 model on the predictions of training examples held aside from calibration at least
`deploy.mixed.min_agreement` of the time, with SmoothQuant off (`_without_smooth_quant`).
Validation data plays no part: it decides the front. Which layers stay in higher precision
follows the trained weights, and with them the speed, so such a model's latency is its own
(`graph_from_weights`). The point records the layers left in higher precision
(`deploy.higher_precision_layers`), how many run in int8, and the agreement the artifact reaches
on the held-aside examples as deployed.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn

from tuner.deploy.backends.base import ConversionContext, calibration_batches
from tuner.deploy.backends.support.openvino_runtime import (
    add_notes,
    exported_ir,
    kept_signal_stack,
    register_openvino_backend,
    save_artifact,
)
from tuner.insight import INT8
from tuner.models import MODEL_FAMILIES
from tuner.serving import openvino as openvino_serving

# Layers that carry weights, and the ops a weight passes through on its way to one (an int8
# weight is a constant converted, shifted by its zero point and scaled).
_WEIGHTED = frozenset({"MatMul", "Convolution", "GroupConvolution"})
_WEIGHT_PATH = frozenset({"Constant", "Convert", "Subtract", "Multiply", "Transpose", "Reshape"})


def _nncf():
    """NNCF, imported with its usage telemetry off: without a consent file it would report
    each quantisation to a web analytics service, and a study's process sends nothing it was
    not asked to (NNCF reads this variable once, at import). Importing it also has PyTorch warn
    that this machine has no CUDA, which deployment on the CPU does not need."""
    os.environ.setdefault("NNCF_CI", "1")
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    import nncf

    return nncf


@contextlib.contextmanager
def _nncf_quiet() -> Iterator[None]:
    """NNCF draws progress bars on standard output and warns through its own logger (a
    calibration set smaller than its default subset size, say) on every call; the OpenVINO
    Cores it makes and drops leave the signal stack to be set back (`kept_signal_stack`)."""
    _nncf().set_log_level(logging.ERROR)
    with contextlib.redirect_stdout(io.StringIO()), kept_signal_stack():
        yield


def _without_smooth_quant():
    """NNCF's advanced parameters with SmoothQuant off. Its accuracy restorer puts a layer back
    in higher precision without undoing SmoothQuant's rescaling of that layer's input: on
    MiniLM it put every layer back and the model agreed with fp32 on 44% of the held-aside
    examples; without SmoothQuant it kept 42 quantisers and agreed on all of them
    (docs/benchmarks.md, OpenVINO on an AMX CPU)."""
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
    )

    return AdvancedQuantizationParameters(
        smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=-1)
    )


# One held-aside example: its feeds, and the fp32 model's prediction for it.
Example = tuple[dict[str, np.ndarray], int]


def _feeds(names: Sequence[str], inputs: Sequence[torch.Tensor]) -> dict[str, np.ndarray]:
    return {name: tensor.numpy() for name, tensor in zip(names, inputs, strict=True)}


def _from_constant(node) -> bool:
    if node.get_type_name() == "Constant":
        return True
    return node.get_type_name() in _WEIGHT_PATH and all(
        _from_constant(node.input_value(i).get_node()) for i in range(node.get_input_size())
    )


def layers_by_precision(ov_model) -> tuple[list[str], list[str]]:
    """The model's weighted layers (matmuls and convolutions with a stored weight): those NNCF
    quantised (an input comes through a FakeQuantize) and those left in higher precision."""
    int8, higher = [], []
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() not in _WEIGHTED:
            continue
        producers = [op.input_value(i).get_node() for i in range(op.get_input_size())]
        if not any(_from_constant(node) for node in producers):
            continue  # activations times activations (attention scores): no weight
        quantised = any(node.get_type_name() == "FakeQuantize" for node in producers)
        (int8 if quantised else higher).append(op.get_friendly_name())
    return int8, higher


def _held_aside(
    model: nn.Module, names: Sequence[str], batches: Sequence[tuple[torch.Tensor, ...]]
) -> list[Example]:
    """Each held-aside example alone, with the fp32 model's prediction for it."""
    examples = []
    with torch.inference_mode():
        for batch in batches:
            predicted = model.eval()(*batch).argmax(-1)
            for row, label in enumerate(predicted.tolist()):
                one = tuple(tensor[row : row + 1] for tensor in batch)
                examples.append((_feeds(names, one), label))
    return examples


def _agreement(compiled, examples) -> tuple[float, list[float]]:
    """NNCF's validation function: the share of examples whose prediction is the fp32
    model's, and each example's agreement (0 or 1), by which NNCF ranks layers."""
    agreed = [float(np.argmax(compiled(feeds)[0], -1)[0] == label) for feeds, label in examples]
    return float(np.mean(agreed)), agreed


def _quantised(model: nn.Module, ctx: ConversionContext) -> tuple[Any, list[Example]]:
    """The NNCF-quantised model, and the examples held aside to control its accuracy (none
    without accuracy control)."""
    nncf = _nncf()

    family = MODEL_FAMILIES.get(str(ctx.recipe.model["family"]))
    model_type = nncf.ModelType.TRANSFORMER if family.modality == "text" else None
    batches = list(calibration_batches(ctx))
    names = ctx.example.names
    if not bool(ctx.deploy.openvino.accuracy_control):
        calibration = nncf.Dataset([_feeds(names, batch) for batch in batches])
        with _nncf_quiet():
            quantised = nncf.quantize(
                exported_ir(model, ctx),
                calibration,
                model_type=model_type,
                subset_size=len(batches),
            )
        return quantised, []
    if len(batches) < 2:
        raise ValueError(
            "accuracy control needs at least two calibration batches, one to calibrate on and "
            f"one to hold aside: deploy.calibration_samples={ctx.deploy.calibration_samples} "
            "gives one"
        )
    calibrate_on, held = batches[: len(batches) // 2], batches[len(batches) // 2 :]
    examples = _held_aside(model, names, held)
    with _nncf_quiet():
        quantised = nncf.quantize_with_accuracy_control(
            exported_ir(model, ctx),
            nncf.Dataset([_feeds(names, batch) for batch in calibrate_on]),
            nncf.Dataset(examples, lambda example: example[0]),
            _agreement,
            max_drop=1.0 - float(ctx.deploy.mixed.min_agreement),
            drop_type=nncf.DropType.ABSOLUTE,
            model_type=model_type,
            subset_size=len(calibrate_on),
            advanced_quantization_parameters=_without_smooth_quant(),
        )
    return quantised, examples


def _export(model: nn.Module, ctx: ConversionContext) -> Path:
    quantised, examples = _quantised(model, ctx)
    int8, higher = layers_by_precision(quantised)
    notes = {"precision": INT8, "accuracy_control": bool(examples), "int8_layers": len(int8)}
    notes["higher_precision_layers"] = higher
    artifact = save_artifact(quantised, ctx.workdir / "openvino_int8", ctx.deploy, notes)
    if examples:
        # NNCF checks agreement with the unquantised layers in f32; the artifact computes them
        # in `deploy.openvino.precision`, so what it reaches as deployed is measured again.
        reached, _ = _agreement(openvino_serving.compiled_model(artifact), examples)
        add_notes(artifact, {"held_aside_examples": len(examples), "held_aside_agreement": reached})
    return artifact


def _controlled(deploy: DictConfig) -> bool:
    return bool(deploy.openvino.accuracy_control)


register_openvino_backend(
    "openvino_int8",
    _export,
    precision=INT8,
    graph_from_weights=_controlled,
    packages=("onnx", "openvino", "nncf"),
)
