"""The backend contract: every registered backend converts a tiny model of each modality it
deploys (a BERT for text, a CNN trained briefly on digits for images) and agrees with eager
within its stated tolerance, or says why it is unavailable here."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from conftest import PROTOCOL, REPO, TINY_BERT, Subject, backend_marks, text_example
from omegaconf import OmegaConf
from torch import nn

from tuner.data.tokens import TokenizedTexts
from tuner.deploy.backends import BACKENDS, Backend
from tuner.deploy.pipeline import convert, deploy_on, reference_of
from tuner.models.recipe import ModelRecipe

# Largest |logit - eager logit| each backend may show on each tiny model. A new backend must
# state its own here, for every modality it deploys.
TOLERANCE = {
    "text": {
        "eager": 0.0,
        "compile": 1e-4,
        "compile_frozen": 1e-4,
        "compile_frozen_bf16": 0.05,
        "merged_qkv": 1e-4,
        "onnxruntime": 1e-4,
        "onnxruntime_fused": 1e-4,
        "bf16": 0.05,
        "int8_dynamic": 0.1,
        "onnxruntime_int8": 0.1,
        "onnxruntime_fused_int8": 0.1,
        "onnxruntime_mixed": 0.1,
        # bf16 where the CPU has it (`deploy.openvino.precision: auto`).
        "openvino": 0.05,
        "openvino_int8": 0.1,
        "cuda_eager": 1e-4,
        "cuda_compile": 1e-4,
        "cuda_fp16": 0.05,
        "cuda_bf16": 0.05,
    },
    # The CNN's logits span about +-10, so int8 rounding moves them further than the BERT's.
    "image": {
        "eager": 0.0,
        "channels_last": 1e-4,
        "conv_bn_folded": 1e-4,
        "compile": 1e-4,
        "compile_frozen": 1e-4,
        "compile_frozen_bf16": 0.3,
        "onnxruntime": 1e-4,
        "onnxruntime_fused": 1e-4,
        "bf16": 0.3,
        "int8_dynamic": 0.2,
        "int8_static": 0.8,
        "onnxruntime_int8": 0.8,
        "onnxruntime_int8_static": 0.8,
        "onnxruntime_mixed": 0.8,
        "openvino": 0.3,
        "openvino_int8": 0.8,
        # cuDNN convolutions run in TF32 on GPUs that have it (PyTorch's default).
        "cuda_eager": 1e-2,
        "cuda_compile": 1e-2,
        "cuda_fp16": 0.3,
        "cuda_bf16": 0.3,
    },
}
# A text model with pruned attention heads (`text_heads_subject`) is held to the text bounds.
TOLERANCE["text_heads"] = TOLERANCE["text"]
# The shipped deploy defaults (int8 settings included), timed on 2 threads.
DEPLOY = OmegaConf.merge(
    OmegaConf.load(REPO / "conf" / "deploy" / "default.yaml"), {"latency": {"num_threads": 2}}
)
# 7-bit weights, what `reduce_range: auto` picks on CPUs without VNNI. Those products cannot
# saturate on any CPU, so these cases check here the numerics an AVX2-only machine ships.
REDUCED_RANGE = OmegaConf.merge(DEPLOY, {"onnx": {"int8": {"reduce_range": True}}})
CASES = [
    (modality, name)
    for name in BACKENDS.names()
    for modality in sorted(BACKENDS.get(name).modalities)
]


def _deploy_subject(name: str, subject: Subject, workdir, deploy=DEPLOY, timer=None):
    reference = reference_of(subject.model, subject.val_data)
    return deploy_on(
        name,
        subject.model,
        subject.recipe,
        reference,
        subject.val_data,
        subject.example,
        PROTOCOL,
        deploy,
        workdir,
        subject.calibration,
        timer,
    )


def _deploy(name, model, data, workdir, deploy=DEPLOY):
    """Deploy `model` (the tiny BERT) on one backend, against its own eager logits on `data`."""
    return _deploy_subject(
        name, Subject(model, TINY_BERT, data, text_example(data), []), workdir, deploy
    )


def test_every_backend_states_a_tolerance_for_each_modality_it_deploys():
    for modality, name in CASES:
        assert name in TOLERANCE[modality], (modality, name)


def _contract_case(modality: str, name: str, deploy=DEPLOY):
    return pytest.param(modality, name, deploy, id=f"{modality}-{name}", marks=backend_marks(name))


ORT_INT8 = (
    "onnxruntime_int8",
    "onnxruntime_int8_static",
    "onnxruntime_fused_int8",
    "onnxruntime_mixed",
)
CONTRACT_CASES = (
    [_contract_case(modality, name) for modality, name in CASES]
    + [
        pytest.param(
            modality,
            name,
            REDUCED_RANGE,
            id=f"{modality}-{name}-reduce_range",
            marks=backend_marks(name),
        )
        for modality, name in CASES
        if name in ORT_INT8
    ]
    # Every text backend deploys a model whose attention heads were pruned.
    + [_contract_case("text_heads", name) for modality, name in CASES if modality == "text"]
)


@pytest.mark.parametrize(("modality", "name", "deploy"), CONTRACT_CASES)
def test_backend_contract(modality, name, deploy, request, tmp_path):
    subject: Subject = request.getfixturevalue(f"{modality}_subject")
    model, data = subject.model, subject.val_data
    backend = BACKENDS.get(name)
    if backend.device == "cuda":  # a study deploying there says so
        deploy = OmegaConf.merge(deploy, {"device": "cuda"})
    reference = reference_of(model, data)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = _deploy_subject(name, subject, tmp_path, deploy)
    reason = backend.unavailable_reason()
    if reason is not None:
        assert isinstance(reason, str) and reason
        assert result.error == f"BackendFailed: unavailable on this machine: {reason}"
        pytest.skip(f"{name} is unavailable on this machine: {reason}")
    tolerance = TOLERANCE[modality][name]
    assert result.error is None, result.error
    assert result.max_logit_diff <= tolerance
    assert result.agreement >= 0.9
    assert result.val_accuracy == pytest.approx(reference.accuracy, abs=0.1)
    assert result.latency is not None and 0 < result.latency.p50_ms <= result.latency.p95_ms
    assert result.model_size_mb > 0 and result.convert_seconds >= 0
    # The measured model is the shipped artifact: loading it again gives the same logits.
    assert result.artifact is not None and result.artifact.parent == tmp_path / name
    reloaded = backend.load(result.artifact, deploy)
    batch = next(data.batches(8))
    with torch.inference_mode():
        again = reloaded(*batch.inputs)
    expected = reference.logits[:8]
    assert (again - expected).abs().max() <= tolerance + 1e-6
    assert math.isfinite(result.peak_memory_mb)
    # GPU memory is a GPU backend's: its fp32 weights at least (the artifact's size, in MB of
    # 10^6 bytes, less its header) were there, in MiB.
    if backend.device == "cuda":
        weights_mib = 0.9 * result.model_size_mb * 1e6 / 2**20
        assert result.metrics()["gpu_peak_memory_mb"] >= weights_mib
    else:
        assert result.gpu_peak_memory_mb is None and "gpu_peak_memory_mb" not in result.metrics()
    # The shipped graph is dumped where the artifact is one; elsewhere its absence says why.
    if backend.graph is not None:
        assert result.graph is not None and result.graph_absent is None
        assert sum(result.graph.ops.values()) == len(result.graph.text.splitlines()) > 0
        assert result.metrics()["layout_ops"] == result.graph.layout_ops
    else:
        assert result.graph is None and "Inductor" in result.graph_absent
        assert "layout_ops" not in result.metrics()
    # Converting never changes the trained model.
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    # A GPU backend's call is no CPU profile; its absence says why.
    if backend.profile is None:
        assert result.profile is None and result.profile_absent.startswith(name)
        assert "profile.total_ms" not in result.metrics()
        return
    # One call profiled apart from the timed ones: its operators' times add up by class, and
    # to the order of what a timed call takes. On these tiny models, whose calls take 0.2-2 ms,
    # the profiler's own cost per operator (some microseconds, over 100-300 operators) can
    # outweigh the call; a wrong unit (microseconds as milliseconds) would be 1000x off. The
    # bounds are the fastest and slowest timed calls: a busy machine (another process beside
    # the test) stretches the median far past what the profiled call took.
    profile = result.profile
    assert profile is not None, result.profile_absent
    assert sum(profile.by_class_ms().values()) == pytest.approx(profile.total_ms)
    assert result.latency.min_ms / 20 <= profile.total_ms <= result.latency.max_ms * 50
    assert result.metrics()["profile.total_ms"] == profile.total_ms
    assert profile.csv().count("\n") == len(profile.rows) + 1


def test_a_failing_profiler_or_graph_dump_leaves_the_point_with_the_reason(
    tiny_bert, val_data, tmp_path, monkeypatch
):
    from dataclasses import replace

    def broken(*args):
        raise RuntimeError("profiler unavailable")

    backend = BACKENDS.get("onnxruntime")
    monkeypatch.setitem(
        BACKENDS._entries, "onnxruntime", replace(backend, profile=broken, graph=broken)
    )
    result = _deploy("onnxruntime", tiny_bert, val_data, tmp_path)
    assert result.error is None and result.latency is not None
    assert result.profile is None and result.graph is None
    assert result.profile_absent == result.graph_absent == "RuntimeError: profiler unavailable"
    assert "profile.total_ms" not in result.metrics() and "layout_ops" not in result.metrics()


def test_static_int8_is_calibrated_on_training_batches(image_subject, tmp_path):
    from tuner.deploy.backends.base import ConversionContext

    backend = BACKENDS.get("int8_static")
    if backend.unavailable_reason():
        pytest.skip(backend.unavailable_reason())
    result = _deploy_subject("int8_static", image_subject, tmp_path / "calibrated")
    assert result.error is None and result.agreement >= 0.95
    # Reloading restores the calibrated scales exactly: no calibration runs again.
    model = image_subject.model
    context = ConversionContext(
        image_subject.example, tmp_path, DEPLOY, image_subject.recipe, image_subject.calibration
    )
    first = backend.load(backend.export(model, context), DEPLOY)
    second = backend.load(backend.export(model, context), DEPLOY)
    batch = next(image_subject.val_data.batches(16))
    with torch.inference_mode():
        assert torch.equal(first(*batch.inputs), second(*batch.inputs))
    # Without calibration batches there is nothing to set activation ranges by: the point fails.
    uncalibrated = Subject(
        model, image_subject.recipe, image_subject.val_data, image_subject.example, []
    )
    failed = _deploy_subject("int8_static", uncalibrated, tmp_path / "uncalibrated")
    assert failed.error is not None and "calibration batches" in failed.error


def test_backends_of_one_model_share_its_exported_and_fused_graphs(
    text_subject, tmp_path, monkeypatch
):
    from tuner.deploy.backends.support import fusion, onnx_export
    from tuner.deploy.pipeline import convert

    made: list[str] = []

    def counted(original, name):
        def call(*args, **kwargs):
            made.append(name)
            return original(*args, **kwargs)

        return call

    # The real export and fusion, counted.
    monkeypatch.setattr(onnx_export, "export_onnx", counted(onnx_export.export_onnx, "export"))
    monkeypatch.setattr(fusion, "_fuse", counted(fusion._fuse, "fuse"))
    shared = tmp_path / "shared"
    names = ["onnxruntime", "onnxruntime_int8", "onnxruntime_fused", "onnxruntime_fused_int8"]
    artifacts = {
        name: convert(
            name,
            text_subject.model,
            text_subject.recipe,
            text_subject.example,
            DEPLOY,
            tmp_path / name,
            text_subject.calibration,
            shared=shared,
        ).artifact
        for name in names
    }
    # One plain export for the fp32 and int8 graphs, one fusion for the fused fp32 and int8 ones.
    assert sorted(made) == ["export", "fuse"]
    assert sorted(p.name for p in shared.iterdir()) == ["model.fp32.onnx", "model.fused.onnx"]
    # Each backend still ships its own artifact from its own directory.
    assert all(artifact.parent == tmp_path / name for name, artifact in artifacts.items())
    assert artifacts["onnxruntime"].read_bytes() == (shared / "model.fp32.onnx").read_bytes()


def test_a_shared_graph_that_fails_to_be_made_leaves_nothing_to_reuse(text_subject, tmp_path):
    from tuner.deploy.backends.base import ConversionContext
    from tuner.deploy.backends.support.onnx_export import shared_graph

    context = ConversionContext(
        text_subject.example, tmp_path, DEPLOY, text_subject.recipe, shared=tmp_path / "shared"
    )

    def half_written(path: Path) -> Path:
        path.write_bytes(b"half a graph")
        raise RuntimeError("export interrupted")

    with pytest.raises(RuntimeError, match="export interrupted"):
        shared_graph(context, "model.fp32.onnx", half_written)
    assert list((tmp_path / "shared").iterdir()) == []

    def whole(path: Path) -> Path:
        path.write_bytes(b"a graph")
        return path

    made = shared_graph(context, "model.fp32.onnx", whole)
    assert made == tmp_path / "shared" / "model.fp32.onnx" and made.read_bytes() == b"a graph"


def test_fused_text_backends_fuse_each_layer_and_say_so(text_subject, tmp_path):
    """The tiny BERT has 2 layers: one attention, two residual LayerNorms and one FFN GELU
    each, one embedding LayerNorm, and a GELU in the classification head."""
    from tuner.insight.graph import graph_ops

    expected = {
        "onnxruntime_fused": {
            "Attention": 2,
            "SkipLayerNormalization": 4,
            "BiasGelu": 2,
            "EmbedLayerNormalization": 1,
            "Gelu": 1,
        },
        # Quantised after fusing: attention and the embedding LayerNorm run as int8 kernels.
        "onnxruntime_fused_int8": {
            "QAttention": 2,
            "SkipLayerNormalization": 4,
            "BiasGelu": 2,
            "QEmbedLayerNormalization": 1,
            "Gelu": 1,
        },
    }
    own_attention = text_subject.model.encoder.config._attn_implementation
    for name, fused in expected.items():
        result = _deploy_subject(name, text_subject, tmp_path / name)
        assert result.error is None, result.error
        assert result.notes == {"fused_ops": fused, "attention_fused": True}
        ops = graph_ops(result.artifact)
        assert not any(op in ("Softmax", "LayerNormalization") for _, op in ops)
        # The point's graph dump counts one fused attention per layer.
        assert result.graph.summary()["by_class"]["attention"] == 2
    # The trained model keeps its own attention for the other backends.
    assert text_subject.model.encoder.config._attn_implementation == own_attention != "eager"
    # A graph exported as it is for plain ONNX Runtime fuses nothing, and a report on it says
    # that its attention is not fused.
    from tuner.deploy.backends.support.fusion import fusion_report

    plain = _deploy_subject("onnxruntime", text_subject, tmp_path / "plain")
    assert fusion_report(plain.artifact, "text") == {"fused_ops": {}, "attention_fused": False}
    # Unfused, each layer's attention is one softmax among matmuls.
    assert plain.graph.ops["Softmax"] == 2


def test_merged_qkv_computes_each_attention_layer_s_projections_in_one_matmul(
    text_subject, image_subject, tmp_path
):
    from tuner.deploy.backends.base import ConversionContext

    result = _deploy_subject("merged_qkv", text_subject, tmp_path / "text")
    assert result.error is None, result.error
    assert result.notes == {"merged_attention": 2}  # the tiny BERT's two layers
    served = BACKENDS.get("merged_qkv").load(result.artifact, DEPLOY)
    hidden = 32
    merged = [m for m in served.modules() if hasattr(m, "qkv")]
    assert len(merged) == 2
    assert not any(name.endswith(("query", "key", "value")) for name, _ in served.named_modules())
    # Rows of the merged weight are the trained query, key and value weights, in that order.
    trained = text_subject.model.encoder.encoder.layer[1].attention.self
    weight, bias = merged[1].qkv.weight, merged[1].qkv.bias
    assert weight.shape == (3 * hidden, hidden)
    assert torch.equal(weight[hidden : 2 * hidden], trained.key.weight)
    assert torch.equal(bias[2 * hidden :], trained.value.bias)
    # A model without such attention (a CNN) is refused when loaded, saying why.
    context = ConversionContext(
        image_subject.example, tmp_path, DEPLOY, image_subject.recipe, image_subject.calibration
    )
    artifact = BACKENDS.get("merged_qkv").export(image_subject.model, context)
    with pytest.raises(ValueError, match="no self-attention with query, key and value"):
        BACKENDS.get("merged_qkv").load(artifact, DEPLOY)


def test_fused_image_graph_folds_batch_norms_into_its_convolutions(image_subject, tmp_path):
    from tuner.insight.graph import graph_ops

    result = _deploy_subject("onnxruntime_fused", image_subject, tmp_path)
    assert result.error is None, result.error
    ops = graph_ops(result.artifact)
    convolutions = sum(isinstance(m, torch.nn.Conv2d) for m in image_subject.model.modules())
    batch_norms = sum(isinstance(m, torch.nn.BatchNorm2d) for m in image_subject.model.modules())
    assert batch_norms > 0
    # Every batch norm folded away; every convolution kept, fused with its activation or not.
    assert not any(op == "BatchNormalization" for _, op in ops)
    assert ops["ai.onnx", "Conv"] + ops["com.microsoft", "FusedConv"] == convolutions
    assert result.notes["fused_ops"]["FusedConv"] == ops["com.microsoft", "FusedConv"] > 0
    assert "attention_fused" not in result.notes


def _near_the_boundary_with_one_fragile_layer(model: torch.nn.Module):
    """A copy of the tiny BERT whose int8 sensitivity is known in advance, and texts it
    classifies by a small margin.

    The first layer's FFN output projection gets 20 times its weights (its output then
    dominates the residual stream), and one weight 1000 times the largest on a neuron that is
    always 0: the fp32 model computes what it did, but with one int8 scale for the whole tensor
    every other weight of that projection rounds to zero. The head's bias is set so that the
    texts' logit margins centre on 0, and the texts kept are those with margins above 0.01:
    far above float rounding and the other layers' int8 errors, below that layer's."""
    from tuner.training import collect_logits

    fragile = copy.deepcopy(model)
    layer = fragile.encoder.encoder.layer[0]
    with torch.no_grad():
        layer.output.dense.weight *= 20
        layer.intermediate.dense.weight[7] = 0
        layer.intermediate.dense.bias[7] = -100  # GELU(-100) is 0
        layer.output.dense.weight[:, 7] = 1000 * layer.output.dense.weight.abs().max()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 100, (200, 16), generator=generator)
    mask = torch.ones(200, 16, dtype=torch.long)
    mask[::3, 10:] = 0
    texts = TokenizedTexts(ids, mask, torch.arange(200) % 2)
    logits = collect_logits(fragile, texts)
    with torch.no_grad():
        fragile.head.out.bias[1] -= (logits[:, 1] - logits[:, 0]).median()
    logits = collect_logits(fragile, texts)
    keep = ((logits[:, 1] - logits[:, 0]).abs() > 0.01).nonzero().flatten()[:48]
    assert len(keep) == 48
    return fragile, TokenizedTexts(ids[keep], mask[keep], torch.arange(48) % 2)


def test_mixed_precision_keeps_the_layer_int8_hurts_most_in_fp32(text_subject, tmp_path):
    per_tensor = OmegaConf.merge(DEPLOY, {"onnx": {"int8": {"per_channel": False}}})
    fragile, texts = _near_the_boundary_with_one_fragile_layer(text_subject.model)
    subject = Subject(
        fragile,
        text_subject.recipe,
        texts,
        text_example(texts),
        [batch.inputs for batch in texts.batches(16)],
    )
    strict = OmegaConf.merge(per_tensor, {"mixed": {"min_agreement": 1.0}})
    result = _deploy_subject("onnxruntime_mixed", subject, tmp_path / "strict", strict)
    assert result.error is None, result.error
    notes = result.notes
    # That projection is the most sensitive node by far, and the only one kept in fp32.
    fragile_node = "/encoder/encoder/layer.0/output/dense/MatMul"
    (most_sensitive, second, *_) = notes["sensitivity"].values()
    assert list(notes["sensitivity"])[0] == fragile_node
    assert most_sensitive > 10 * second
    assert notes["fp32_nodes"] == [fragile_node]
    assert notes["train_agreement"] == 1.0
    assert notes["int8_nodes"] == len(notes["sensitivity"]) - 1
    # Every matmul with weights was scored: Q, K, V, attention output, FFN in and out in each
    # of the 2 layers, the head's two (exported as Gemm, quantised as MatMul), and the three
    # embedding lookups (words, positions, token types).
    scored = notes["sensitivity"]
    assert len([n for n in scored if n.endswith("MatMul")]) == 12 + 2
    assert len([n for n in scored if n.endswith("Gather")]) == 3
    # The artifact keeps exactly those nodes in fp32 (under their names) and quantises the
    # other matmuls.
    import onnx

    nodes = {n.name: n.op_type for n in onnx.load(str(result.artifact)).graph.node}
    kept_matmuls = [n for n in notes["fp32_nodes"] if n.endswith("MatMul")]
    assert all(nodes[name] == "MatMul" for name in kept_matmuls)
    assert list(nodes.values()).count("MatMulInteger") == 14 - len(kept_matmuls)
    # As few as needed: with that node in int8 too, the agreement asked for is missed.
    import onnxruntime as ort
    from onnxruntime.quantization import quantize_dynamic

    from tuner.deploy.backends.support.onnx_export import int8_options

    every_node = tmp_path / "every-node-int8.onnx"
    # The fp32 export it started from, in the directory the model's backends share.
    exported = tmp_path / "strict" / "shared" / "model.fp32.onnx"
    quantize_dynamic(str(exported), str(every_node), **int8_options(strict))
    session = ort.InferenceSession(str(every_node), providers=["CPUExecutionProvider"])
    int8_logits = session.run(
        None, {"input_ids": texts.input_ids.numpy(), "attention_mask": texts.attention_mask.numpy()}
    )[0]
    with torch.inference_mode():
        fp32_logits = fragile(texts.input_ids, texts.attention_mask)
    assert (torch.from_numpy(int8_logits).argmax(-1) != fp32_logits.argmax(-1)).any()
    # Asking for no agreement at all keeps nothing in fp32.
    loose = OmegaConf.merge(per_tensor, {"mixed": {"min_agreement": 0.0}})
    result = _deploy_subject("onnxruntime_mixed", subject, tmp_path / "loose", loose)
    assert result.error is None and result.notes["fp32_nodes"] == []


@pytest.mark.parametrize(("allow_spinning", "entry"), [(False, "0"), (True, "1")])
def test_onnx_runtime_sessions_spin_only_where_the_config_says(allow_spinning, entry, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from tuner.serving.onnxruntime import open_session

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
    )
    path = tmp_path / "relu.onnx"
    # IR version 8 (opset 17's): the onnx package's newest IR can be ahead of its runtime's.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)
    deploy = OmegaConf.merge(DEPLOY, {"onnx": {"allow_spinning": allow_spinning}})
    session, feeds_of = open_session(path, deploy)
    options = session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == entry
    assert options.intra_op_num_threads == 2
    (y,) = session.run(None, feeds_of((torch.tensor([[-1.0, 0.0, 2.0]]),)))
    assert y.tolist() == [[0.0, 0.0, 2.0]]


def test_int8_backends_make_smaller_artifacts(tiny_bert, val_data, tmp_path):
    sizes = {
        name: _deploy(name, tiny_bert, val_data, tmp_path / name).model_size_mb
        for name in ("eager", "int8_dynamic", "onnxruntime", "onnxruntime_int8")
    }
    assert sizes["int8_dynamic"] < sizes["eager"]
    assert sizes["onnxruntime_int8"] < sizes["onnxruntime"]


def test_non_finite_outputs_fail_the_point(tiny_bert, val_data, monkeypatch, tmp_path):
    def export(model, ctx):
        artifact = ctx.workdir / "model.bin"
        artifact.write_bytes(b"0")
        return artifact

    def load(artifact, deploy):
        # What a half-precision overflow looks like from outside: inf and NaN logits.
        def logits_of(input_ids, attention_mask):
            logits = tiny_bert(input_ids, attention_mask)
            logits[0, 0] = float("inf")
            return logits

        return logits_of

    monkeypatch.setitem(BACKENDS._entries, "overflowing", Backend("overflowing", export, load))
    result = _deploy("overflowing", tiny_bert, val_data, tmp_path)
    assert result.error is not None
    assert "non-finite outputs (NaN/Inf) on 1 of 48 examples" in result.error


def test_a_point_is_timed_with_no_memory_sampler_beside_it(text_subject, tmp_path):
    import threading

    from tuner.latency.memory import SAMPLER_THREAD
    from tuner.latency.protocol import measure_latency

    threads_while_timed = []

    def timer(logits_of):
        threads_while_timed.append({thread.name for thread in threading.enumerate()})
        return measure_latency(logits_of, text_subject.example, PROTOCOL)

    result = _deploy_subject("eager", text_subject, tmp_path, timer=timer)
    assert result.error is None and result.latency is not None
    (names,) = threads_while_timed
    assert SAMPLER_THREAD not in names
    # Conversion and the accuracy check were sampled.
    assert math.isfinite(result.peak_memory_mb)


def test_export_error_is_kept_on_the_point(tiny_bert, val_data, tmp_path):
    broken = OmegaConf.merge(DEPLOY, {"onnx": {"opset": 1}})
    result = _deploy("onnxruntime", tiny_bert, val_data, tmp_path, broken)
    assert result.error is not None and "opset" in result.error.lower()
    assert result.latency is None


def test_pytorch_artifacts_are_plain_tensors_with_their_recipe(tiny_bert, val_data, tmp_path):
    from safetensors import safe_open

    from tuner.deploy.backends.support.torch_files import RECIPE_KEY

    artifact = _deploy("eager", tiny_bert, val_data, tmp_path).artifact
    with safe_open(str(artifact), framework="pt") as stored:
        assert ModelRecipe.from_json(stored.metadata()[RECIPE_KEY]) == TINY_BERT
    quantized = _deploy("int8_dynamic", tiny_bert, val_data, tmp_path).artifact
    # Quantised weights are safetensors too: nothing in them is unpickled.
    with safe_open(str(quantized), framework="pt") as stored:
        assert ModelRecipe.from_json(stored.metadata()[RECIPE_KEY]) == TINY_BERT
        assert any(stored.get_tensor(key).dtype == torch.int8 for key in stored.keys())


class _RunsCode:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_a_pickled_object_in_an_artifact_is_refused(tmp_path, capsys):
    import pickle

    from tuner.deploy.backends.support.torch_files import RECIPE_KEY, load_quantized

    bad = tmp_path / "model.int8.pt"
    torch.save({RECIPE_KEY: TINY_BERT.to_json(), "state_dict": _RunsCode()}, bad)
    with pytest.raises(pickle.UnpicklingError):
        load_quantized(bad, lambda model, saved: model)
    assert "this must never run" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("deploy.mixed.min_agreement=1.5", "'deploy.mixed.min_agreement': 1.5 must be a share"),
        ("train.group_by_length=sometimes", "'train.group_by_length': 'sometimes' must be true"),
        ("deploy.openvino.precision=fp16", "'deploy.openvino.precision': 'fp16' must be auto"),
        ("deploy.openvino.accuracy_control=maybe", "'deploy.openvino.accuracy_control'"),
    ],
)
def test_bad_deploy_and_batching_settings_are_refused_at_start_up(override, named):
    from tuner.config.compose import compose_config
    from tuner.errors import ConfigError
    from tuner.study.preparation import prepare

    args = ["+experiment=bert_ffn", "debug=smoke", override]
    with pytest.raises(ConfigError) as refused:
        prepare(compose_config(args), {}, [override.split("=")[0]])
    assert named in str(refused.value)


@pytest.mark.slow
def test_a_compiled_backend_compiles_every_architecture_one_process_loads(val_data, tmp_path):
    """Five architectures, each called at batch 1 and batch 8: ten compiled graphs, more than
    Dynamo keeps for one function (8), after which it would run further models eagerly."""
    from torch._dynamo.utils import counters

    name = "compile_frozen"
    if BACKENDS.get(name).unavailable_reason():
        pytest.skip(f"{name} is unavailable here: {BACKENDS.get(name).unavailable_reason()}")
    example = text_example(val_data)
    batch = next(val_data.batches(8)).inputs
    for width in (64, 128, 192, 256, 320):
        model_cfg = copy.deepcopy(TINY_BERT.model)
        model_cfg["config_overrides"]["intermediate_size"] = width
        recipe = ModelRecipe(model=model_cfg, num_labels=2)
        torch.manual_seed(width)
        model = recipe.build().eval()
        graphs = counters["stats"]["unique_graphs"]
        converted = convert(name, model, recipe, example, DEPLOY, tmp_path / str(width))
        with torch.no_grad():
            logits = converted.logits_of(*batch)
            expected = model(*batch)
        # Both shapes compiled for this model (batch 1 during conversion), none run eagerly.
        assert counters["stats"]["unique_graphs"] - graphs == 2, width
        assert (logits - expected).abs().max() <= TOLERANCE["text"][name]


@pytest.mark.slow
def test_a_compiled_model_takes_later_batches_in_one_graph_and_image_sizes_as_constants():
    """A served model's requests of 8 and then 5 images run one compiled graph; an image of
    another size compiles another, its height and width having been constants, although a
    model of another class the process compiled before it was called at two sizes. A model of
    that other class compiles the sizes its family's calls changed symbolic at once."""
    from torch._dynamo.utils import counters

    from tuner.deploy.backends.compile import compile_unavailable, compiled_alone

    if compile_unavailable():
        pytest.skip(f"torch.compile is unavailable here: {compile_unavailable()}")

    class OtherFamily(nn.Sequential):
        pass

    def small_cnn(family: type[nn.Sequential]) -> nn.Module:
        layers = (nn.Conv2d(1, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        return family(*layers).eval()

    def graphs_after_each_call(model: nn.Module, *calls: tuple[int, int]) -> list[int]:
        """The graphs compiled for `model` after each call, a call being (batch, side)."""
        compiled = compiled_alone(model)
        before, graphs = counters["stats"]["unique_graphs"], []
        with torch.no_grad():
            for batch, side in calls:
                images = torch.randn(batch, 1, side, side)
                assert torch.allclose(compiled(images), model(images), atol=1e-5)
                graphs.append(counters["stats"]["unique_graphs"] - before)
        return graphs

    torch.manual_seed(0)
    # The other family's first model: its height and width change at the second call.
    assert graphs_after_each_call(small_cnn(OtherFamily), (8, 20), (8, 24)) == [1, 2]
    assert graphs_after_each_call(small_cnn(nn.Sequential), (8, 12), (5, 12), (8, 16)) == [1, 1, 2]
    # The other family's next model: one graph for both sizes, symbolic from its first call.
    assert graphs_after_each_call(small_cnn(OtherFamily), (8, 28), (8, 32)) == [1, 1]


def test_fused_backends_fuse_the_attention_of_pruned_heads(text_heads_subject, tmp_path):
    """With 3 of 4 heads kept, each layer's attention is still one fused node, of 3 heads."""
    import onnx

    expected = {"onnxruntime_fused": "Attention", "onnxruntime_fused_int8": "QAttention"}
    for name, op in expected.items():
        result = _deploy_subject(name, text_heads_subject, tmp_path / name)
        assert result.error is None, result.error
        assert result.notes["attention_fused"] is True
        assert result.notes["fused_ops"][op] == 2
        nodes = onnx.load(str(result.artifact)).graph.node
        heads = [
            attribute.i
            for node in nodes
            if node.op_type == op
            for attribute in node.attribute
            if attribute.name == "num_heads"
        ]
        assert heads == [3, 3]
