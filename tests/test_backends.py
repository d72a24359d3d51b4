"""The backend contract: every registered backend converts a tiny BERT and agrees with eager
within its stated tolerance, or says why it is unavailable here."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY_BERT
from omegaconf import OmegaConf

from tuner.backends import BACKENDS, Backend, ExampleInputs
from tuner.data.tokens import TokenizedTexts
from tuner.deploy import deploy_on, reference_of
from tuner.latency import LatencyProtocol
from tuner.recipe import ModelRecipe

# Largest |logit - eager logit| each backend may show on the tiny model. A new backend must
# state its own here.
TOLERANCE = {
    "eager": 0.0,
    "compile": 1e-4,
    "onnxruntime": 1e-4,
    "bf16": 0.05,
    "int8_dynamic": 0.1,
    "onnxruntime_int8": 0.1,
}
DEPLOY = OmegaConf.create(
    {"latency": {"num_threads": 2}, "onnx": {"opset": 17}, "compile": {"mode": "default"}}
)
PROTOCOL = LatencyProtocol(batch_size=1, seq_len=16, num_threads=2, warmup=1, repeats=3)


@pytest.fixture
def val_data() -> TokenizedTexts:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 100, (48, 16), generator=generator)
    mask = torch.ones(48, 16, dtype=torch.long)
    mask[::3, 10:] = 0  # some padded examples
    return TokenizedTexts(ids, mask, torch.arange(48) % 2)


def _example(data: TokenizedTexts) -> ExampleInputs:
    names = ("input_ids", "attention_mask")
    dynamic = {name: {0: "batch", 1: "sequence"} for name in names}
    return ExampleInputs((data.input_ids[:1], data.attention_mask[:1]), names, dynamic)


def _deploy(name, model, data, workdir, deploy=DEPLOY):
    """Deploy `model` (the tiny BERT) on one backend, against its own eager logits on `data`."""
    reference = reference_of(model, data)
    example = _example(data)
    return deploy_on(name, model, TINY_BERT, reference, data, example, PROTOCOL, deploy, workdir)


def test_every_backend_states_a_tolerance():
    assert set(BACKENDS.names()) <= set(TOLERANCE)


@pytest.mark.parametrize("name", BACKENDS.names())
def test_backend_contract(name, tiny_bert, val_data, tmp_path):
    backend = BACKENDS.get(name)
    reference = reference_of(tiny_bert, val_data)
    before = {k: v.clone() for k, v in tiny_bert.state_dict().items()}
    result = _deploy(name, tiny_bert, val_data, tmp_path)
    reason = backend.unavailable_reason()
    if reason is not None:
        assert isinstance(reason, str) and reason
        assert result.error == f"BackendFailed: unavailable on this machine: {reason}"
        return
    assert result.error is None, result.error
    assert result.max_logit_diff <= TOLERANCE[name]
    assert result.agreement >= 0.9
    assert result.val_accuracy == pytest.approx(
        float((reference.logits.argmax(-1) == val_data.labels).float().mean()), abs=0.1
    )
    assert result.latency is not None and 0 < result.latency.p50_ms <= result.latency.p95_ms
    assert result.model_size_mb > 0 and result.convert_seconds >= 0
    # The measured model is the shipped artifact: loading it again gives the same logits.
    assert result.artifact is not None and result.artifact.parent == tmp_path
    reloaded = backend.load(result.artifact, DEPLOY)
    batch = next(val_data.batches(8))
    with torch.inference_mode():
        again = reloaded(*batch.inputs)
    expected = reference.logits[:8]
    assert (again - expected).abs().max() <= TOLERANCE[name] + 1e-6
    assert math.isfinite(result.peak_memory_mb)
    # Converting never changes the trained model.
    for key, value in tiny_bert.state_dict().items():
        assert torch.equal(value, before[key]), key


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


def test_export_error_is_kept_on_the_point(tiny_bert, val_data, tmp_path):
    broken = OmegaConf.merge(DEPLOY, {"onnx": {"opset": 1}})
    result = _deploy("onnxruntime", tiny_bert, val_data, tmp_path, broken)
    assert result.error is not None and "opset" in result.error.lower()
    assert result.latency is None


def test_pytorch_artifacts_are_plain_tensors_with_their_recipe(tiny_bert, val_data, tmp_path):
    from safetensors import safe_open

    from tuner.backends.torch_files import RECIPE_KEY

    artifact = _deploy("eager", tiny_bert, val_data, tmp_path).artifact
    with safe_open(str(artifact), framework="pt") as stored:
        assert ModelRecipe.from_json(stored.metadata()[RECIPE_KEY]) == TINY_BERT
    quantized = _deploy("int8_dynamic", tiny_bert, val_data, tmp_path).artifact
    # Readable without unpickling any code.
    saved = torch.load(quantized, weights_only=True)
    assert set(saved) == {RECIPE_KEY, "state_dict"}


class _RunsCode:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_a_pickled_object_in_an_artifact_is_refused(tmp_path, capsys):
    import pickle

    from tuner.backends.torch_files import RECIPE_KEY, load_quantized

    bad = tmp_path / "model.int8.pt"
    torch.save({RECIPE_KEY: TINY_BERT.to_json(), "state_dict": _RunsCode()}, bad)
    with pytest.raises(pickle.UnpicklingError):
        load_quantized(bad, lambda model: model)
    assert "this must never run" not in capsys.readouterr().out
