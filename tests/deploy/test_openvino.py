"""The OpenVINO backends beyond the contract every backend meets (tests/deploy/test_backends.py):
the precision they compile in, served as measured, NNCF's int8 with and without accuracy
control, and their settings in the latency keys of OpenVINO backends only."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, TINY_BERT, Subject, machine_runs, text_example
from omegaconf import OmegaConf
from test_backends import DEPLOY, _deploy_subject, _near_the_boundary_with_one_fragile_layer

from tuner.deploy.backends import BACKENDS
from tuner.store.latency_table import latency_key, measured_alike, structure_of

pytestmark = pytest.mark.skipif(
    not machine_runs("openvino_int8"), reason="the openvino and nncf packages are not installed"
)


def _compiled_precision(artifact) -> str:
    import openvino as ov

    core = ov.Core()
    settings = json.loads((artifact / "compile.json").read_text())
    compiled = core.compile_model(
        core.read_model(artifact / "model.xml"), "CPU", settings["properties"]
    )
    return compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()


def _native_bf16() -> bool:
    """Whether `auto` computes in bf16, worked out from the CPU's flags and the oneDNN cap
    (`machine_runs("bf16")`): bf16 where the CPU has AVX-512 BF16 or AMX and oneDNN is not
    capped below its bf16 kernels, f32 elsewhere."""
    return machine_runs("bf16")


def test_auto_precision_is_bf16_exactly_where_the_cpu_has_it_and_recorded(text_subject, tmp_path):
    result = _deploy_subject("openvino", text_subject, tmp_path)
    assert result.error is None, result.error
    expected = "bf16" if _native_bf16() else "f32"
    assert result.notes["inference_precision"] == expected
    # The roofline judges the point in the precision it took.
    assert result.notes["precision"] == {"bf16": "bf16", "f32": "fp32"}[expected]
    assert _compiled_precision(result.artifact) == expected


def test_f32_precision_matches_eager_to_float_rounding(text_subject, tmp_path):
    f32 = OmegaConf.merge(DEPLOY, {"openvino": {"precision": "f32"}})
    result = _deploy_subject("openvino", text_subject, tmp_path, f32)
    assert result.error is None, result.error
    assert result.notes["inference_precision"] == "f32"
    assert result.max_logit_diff <= 1e-4
    assert _compiled_precision(result.artifact) == "f32"


def test_the_served_model_compiles_as_it_was_timed_whatever_config_loads_it(text_subject, tmp_path):
    """The artifact keeps the properties resolved at export: loading it under other settings
    (another thread count, another precision) runs the model that was measured."""
    result = _deploy_subject("openvino", text_subject, tmp_path)
    assert result.error is None, result.error
    settings = json.loads((result.artifact / "compile.json").read_text())
    assert settings["properties"] == {
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": 2,
        "INFERENCE_PRECISION_HINT": result.notes["inference_precision"],
    }
    other = OmegaConf.merge(
        DEPLOY, {"openvino": {"precision": "f32"}, "latency": {"num_threads": 1}}
    )
    timed = BACKENDS.get("openvino").load(result.artifact, DEPLOY)
    served = BACKENDS.get("openvino").load(result.artifact, other)
    inputs = next(text_subject.val_data.batches(8)).inputs
    assert torch.equal(served(*inputs), timed(*inputs))


def test_int8_quantises_the_weighted_layers_and_lists_those_it_leaves(text_subject, tmp_path):
    result = _deploy_subject("openvino_int8", text_subject, tmp_path)
    assert result.error is None, result.error
    notes = result.notes
    assert notes["precision"] == "int8" and notes["accuracy_control"] is False
    # Every linear layer the tiny BERT calls (Q, K, V, attention output, FFN in and out in each
    # of its 2 layers, and the head's two; not the pooler, which the classifier never calls) is
    # counted once, as int8 or as left in higher precision.
    assert notes["int8_layers"] + len(notes["higher_precision_layers"]) == 12 + 2
    assert notes["int8_layers"] >= 12
    # Without accuracy control the graph is the architecture's: its latency is the table's.
    assert not BACKENDS.get("openvino_int8").follows_weights(DEPLOY)


def _held_aside_agreement(subject: Subject, artifact, deploy) -> float:
    """How often the artifact's predictions on the calibration batches' second half (what
    accuracy control holds aside) are the fp32 model's, worked out here."""
    logits_of = BACKENDS.get("openvino_int8").load(artifact, deploy)
    held = subject.calibration[len(subject.calibration) // 2 :]
    with torch.inference_mode():
        fp32 = torch.cat([subject.model(*batch) for batch in held]).argmax(-1)
        int8 = torch.cat([logits_of(*batch) for batch in held]).argmax(-1)
    return float((int8 == fp32).float().mean())


@pytest.mark.slow
def test_accuracy_control_keeps_layers_in_higher_precision_until_the_agreement_is_reached(
    image_subject, tmp_path
):
    """On the digits CNN (confident predictions), asking for full agreement on the held-aside
    training examples: the int8 model reaches it by keeping more layers out of int8 than plain
    quantisation does, where plain quantisation misses it; where plain reaches it, nothing more
    is kept. Unquantised layers in f32, as NNCF checks the agreement."""
    f32 = OmegaConf.merge(DEPLOY, {"openvino": {"precision": "f32"}})
    controlled_cfg = OmegaConf.merge(
        f32, {"openvino": {"accuracy_control": True}, "mixed": {"min_agreement": 1.0}}
    )
    plain = _deploy_subject("openvino_int8", image_subject, tmp_path / "plain", f32)
    controlled = _deploy_subject(
        "openvino_int8", image_subject, tmp_path / "controlled", controlled_cfg
    )
    assert plain.error is None and controlled.error is None, (plain.error, controlled.error)
    assert controlled.notes["accuracy_control"] is True
    # Four calibration batches of 32: two calibrate, two (64 examples) are held aside.
    assert len(image_subject.calibration) == 4
    assert controlled.notes["held_aside_examples"] == 64
    reached = _held_aside_agreement(image_subject, controlled.artifact, controlled_cfg)
    assert reached == 1.0 == controlled.notes["held_aside_agreement"]
    kept_plain = set(plain.notes["higher_precision_layers"])
    kept = set(controlled.notes["higher_precision_layers"])
    assert kept >= kept_plain
    assert controlled.notes["int8_layers"] + len(kept) == plain.notes["int8_layers"] + len(
        kept_plain
    )
    if _held_aside_agreement(image_subject, plain.artifact, f32) < 1.0:
        assert kept > kept_plain
    else:
        assert kept == kept_plain
    # Which layers stay follows the trained weights: such a model is timed on its own.
    assert BACKENDS.get("openvino_int8").follows_weights(controlled_cfg)


@pytest.mark.slow
def test_accuracy_control_on_a_transformer_puts_the_layer_int8_hurts_most_back(
    text_subject, tmp_path
):
    """The tiny BERT with one FFN projection that int8 ruins and texts it classifies by small
    margins: accuracy control puts that projection back in higher precision and reaches full
    agreement on the held-aside texts, which a layer put back with its input still rescaled by
    SmoothQuant would miss."""
    fragile, texts = _near_the_boundary_with_one_fragile_layer(text_subject.model)
    subject = Subject(
        fragile, TINY_BERT, texts, text_example(texts), [b.inputs for b in texts.batches(16)]
    )
    controlled_cfg = OmegaConf.merge(
        DEPLOY,
        {
            "openvino": {"precision": "f32", "accuracy_control": True},
            "mixed": {"min_agreement": 1.0},
        },
    )
    result = _deploy_subject("openvino_int8", subject, tmp_path, controlled_cfg)
    assert result.error is None, result.error
    assert "/encoder/encoder/layer.0/output/dense/MatMul" in result.notes["higher_precision_layers"]
    # Three batches of 16: one calibrates, two (32 texts) are held aside.
    assert result.notes["held_aside_examples"] == 32
    assert _held_aside_agreement(subject, result.artifact, controlled_cfg) == 1.0
    assert result.notes["held_aside_agreement"] == 1.0


@pytest.mark.slow
def test_the_held_aside_agreement_recorded_is_the_artifact_s_as_deployed(image_subject, tmp_path):
    """In bf16 where the CPU has it: the agreement is measured again on the compiled artifact,
    not taken from NNCF's check, which computes unquantised layers in f32."""
    controlled_cfg = OmegaConf.merge(DEPLOY, {"openvino": {"accuracy_control": True}})
    result = _deploy_subject("openvino_int8", image_subject, tmp_path, controlled_cfg)
    assert result.error is None, result.error
    expected = _held_aside_agreement(image_subject, result.artifact, controlled_cfg)
    assert result.notes["held_aside_agreement"] == pytest.approx(expected)


def test_accuracy_control_with_one_calibration_batch_fails_the_point_saying_why(
    text_subject, tmp_path
):
    one = Subject(
        text_subject.model,
        TINY_BERT,
        text_subject.val_data,
        text_subject.example,
        text_subject.calibration[:1],
    )
    controlled = OmegaConf.merge(DEPLOY, {"openvino": {"accuracy_control": True}})
    result = _deploy_subject("openvino_int8", one, tmp_path, controlled)
    assert result.error is not None
    assert "two calibration batches" in result.error
    assert "deploy.calibration_samples" in result.error


RECORD = {
    "latency.cpu": "a CPU",
    "latency.num_threads": 2,
    "latency.torch_version": "2.14.1",
    "latency.onnxruntime_version": "1.32.0",
}
OPENVINO_RECORD = {**RECORD, "latency.openvino_version": "2026.4.1", "latency.nncf_version": "3.4"}


def test_openvino_settings_and_versions_are_in_openvino_keys_only(tiny_bert):
    model_cfg = OmegaConf.create(TINY_BERT.model)
    structure = structure_of(tiny_bert)
    without = OmegaConf.create({k: v for k, v in DEPLOY.items() if k != "openvino"})
    bf16 = OmegaConf.merge(DEPLOY, {"openvino": {"precision": "bf16"}})
    # Other backends' keys are what they were before OpenVINO came.
    for backend in ("eager", "onnxruntime_int8"):
        before = latency_key(model_cfg, structure, backend, without, RECORD)
        assert latency_key(model_cfg, structure, backend, DEPLOY, OPENVINO_RECORD) == before
        assert latency_key(model_cfg, structure, backend, bf16, OPENVINO_RECORD) == before
        assert measured_alike(before, bf16, OPENVINO_RECORD)
    # An OpenVINO backend's key follows its settings and the runtime's and quantiser's versions.
    for backend in ("openvino", "openvino_int8"):
        key = latency_key(model_cfg, structure, backend, DEPLOY, OPENVINO_RECORD)
        assert key["deploy"]["openvino"] == {"precision": "auto", "accuracy_control": False}
        assert key["protocol"]["latency.openvino_version"] == "2026.4.1"
        assert key != latency_key(model_cfg, structure, backend, bf16, OPENVINO_RECORD)
        newer = {**OPENVINO_RECORD, "latency.openvino_version": "2027.0"}
        assert key != latency_key(model_cfg, structure, backend, DEPLOY, newer)
        assert not measured_alike(key, bf16, OPENVINO_RECORD)
        assert measured_alike(key, DEPLOY, OPENVINO_RECORD)


def test_the_protocol_records_the_openvino_and_nncf_versions():
    from importlib.metadata import version

    from tuner.latency import LatencyProtocol

    record = LatencyProtocol(batch_size=1, seq_len=8, num_threads=2, warmup=1, repeats=2).record()
    assert record["openvino_version"] == version("openvino")
    assert record["nncf_version"] == version("nncf")


@pytest.mark.skipif(_native_bf16(), reason="this CPU has native bf16")
def test_bf16_asked_of_a_cpu_without_it_is_refused_at_start_up():
    from tuner.errors import ConfigError
    from tuner.study.backends import check_backends

    bf16 = OmegaConf.merge(DEPLOY, {"openvino": {"precision": "bf16"}})
    with pytest.raises(ConfigError) as refused:
        check_backends(["eager", "openvino"], "text", bf16, {})
    assert "'deploy.openvino.precision': bf16" in str(refused.value)
    assert "BF16" in str(refused.value)
    # A study that deploys on no OpenVINO backend has no use for the setting.
    check_backends(["eager"], "text", bf16, {})


def test_bf16_is_taken_where_the_cpu_has_it():
    from tuner.study.backends import check_backends

    bf16 = OmegaConf.merge(DEPLOY, {"openvino": {"precision": "bf16"}})
    if _native_bf16():
        check_backends(["eager", "openvino"], "text", bf16, {})


def test_agreement_is_counted_per_held_aside_example():
    from tuner.deploy.backends.openvino_int8 import _agreement

    examples = [({"x": np.zeros(1)}, 0), ({"x": np.ones(1)}, 1), ({"x": np.ones(1)}, 0)]

    def compiled(feeds):  # predicts class 1 for ones, class 0 for zeros
        return [np.array([[1.0 - feeds["x"][0], feeds["x"][0]]])]

    share, each = _agreement(compiled, examples)
    assert each == [1.0, 1.0, 0.0]
    assert share == pytest.approx(2 / 3)


@pytest.mark.slow  # a new interpreter imports tuner and NNCF: 6 s on 2 cores
def test_nncf_reports_nothing_from_a_study_s_process():
    """Without a consent file NNCF reports each quantisation to a web analytics service; in a
    process that imports it through tuner it has only its stand-in that sends nothing. Run in a
    fresh interpreter: NNCF also turns its telemetry off when it finds pytest imported."""
    code = (
        "from tuner.deploy.backends.openvino_int8 import _nncf\n"
        "_nncf()\n"
        "import sys\n"
        "from nncf.telemetry.wrapper import NNCFTelemetryStub, telemetry\n"
        "assert 'pytest' not in sys.modules\n"
        "print(isinstance(telemetry, NNCFTelemetryStub))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("NNCF_CI", "NNCF_DEV")}
    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "True"


def test_without_nncf_only_the_int8_backend_is_left_out_saying_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "nncf", None)  # what find_spec reads as not installed
    assert BACKENDS.get("openvino_int8").unavailable_reason() == (
        "the `nncf` package is not installed"
    )
    assert BACKENDS.get("openvino").unavailable_reason() is None


_STOPPED_AFTER_NNCF = """
import gc, os, signal, sys
from pathlib import Path
sys.path[:0] = [{tests!r}, {deploy!r}]
from omegaconf import OmegaConf
from conftest import digits_subject
from test_backends import DEPLOY, _deploy_subject
from tuner.interrupts import Terminated, interruptible

subject = digits_subject()
f32 = OmegaConf.merge(DEPLOY, {{"openvino": {{"precision": "f32"}}}})
controlled = OmegaConf.merge(
    f32, {{"openvino": {{"accuracy_control": True}}, "mixed": {{"min_agreement": 1.0}}}}
)
# Plain, then with accuracy control, whose Cores NNCF drops out of the order it made them.
for name, deploy in (("plain", f32), ("controlled", controlled)):
    result = _deploy_subject("openvino_int8", subject, Path({workdir!r}) / name, deploy)
    assert result.error is None, result.error
del result
gc.collect()  # what NNCF made and dropped is gone, as it is by the time a study is stopped
with interruptible():
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100_000):
            pass
    except Terminated:
        print("stopped")
"""


@pytest.mark.slow
def test_a_signal_after_nncf_quantised_stops_the_process_as_usual(tmp_path):
    """NNCF makes and drops OpenVINO Cores out of order, which left the thread's alternate
    signal stack on freed memory: the SIGTERM (or Ctrl-C) that should stop a study cleanly
    crashed it. In a process of its own, so that a crash is the process's, not the suite's."""
    code = _STOPPED_AFTER_NNCF.format(
        tests=str(REPO / "tests"), deploy=str(REPO / "tests" / "deploy"), workdir=str(tmp_path)
    )
    ran = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert ran.returncode == 0, (ran.returncode, ran.stderr[-2000:])
    assert ran.stdout.strip().splitlines()[-1] == "stopped"
