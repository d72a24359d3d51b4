"""What ships is what was measured: for every backend this machine runs, the logged MLflow model
classifies raw validation examples exactly as the deployment that measured the point did. A
logged model holds no pickle, and models logged with a pickle by earlier versions still load."""

from __future__ import annotations

import pickletools
import sys
import types
import zipfile
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from conftest import PROTOCOL, REPO, TINY_BERT, TINY_BERT_DIR, backend_marks
from omegaconf import OmegaConf
from test_backends import DEPLOY

from tuner.deploy.backends import BACKENDS, unavailable_backends
from tuner.deploy.pipeline import convert
from tuner.deploy.serving import PointModel, PointSpec, deploy_config, log_point_model
from tuner.modalities.image import ImageModality
from tuner.modalities.text import TextModality
from tuner.training import collect_logits

# Raw texts of very different lengths, more of them than one evaluation batch, so that batches
# are trimmed to different lengths and int8 activation ranges differ from batch to batch.
TEXTS = [
    " ".join(["a", "fine", "film", "about", "grief"][: 1 + i % 5] * (1 + i % 7)) + f" {i}"
    for i in range(150)
]


def _available(modality: str) -> list:
    """A case per backend of `modality`; those this machine cannot run skip with the reason."""
    names = [name for name in BACKENDS.names() if modality in BACKENDS.get(name).modalities]
    left_out = unavailable_backends(names)
    return [
        pytest.param(
            name,
            marks=(
                [pytest.mark.skip(reason=f"{name} is unavailable here: {left_out[name]}")]
                if name in left_out
                else []
            )
            + backend_marks(name),
            id=name,
        )
        for name in names
    ]


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    path = tmp_path_factory.mktemp("serving")
    uri = f"sqlite:///{path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient(uri)
    return client, client.create_experiment("serving", artifact_location=str(path / "artifacts"))


@pytest.fixture(scope="module")
def text_point():
    """The tiny random-init BERT with its own tokenizer."""
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    model = TINY_BERT.build().eval()
    tokenizer = AutoTokenizer.from_pretrained(TINY_BERT_DIR)
    return model, TINY_BERT, TextModality(tokenizer, 48)


def _is_pickle(data: bytes) -> bool:
    """Whether `data` starts as a pickle: its protocol opcode (2 to 5) and one more opcode that
    parses, which tells it from a safetensors header length that begins with the same bytes."""
    if len(data) < 3 or data[0] != 0x80 or data[1] not in range(2, 6):
        return False
    opcodes = pickletools.genops(data)
    try:
        next(opcodes)
        next(opcodes)
    except ValueError:
        return False
    return True


def _assert_no_pickle(model_dir: Path) -> None:
    """No file of the logged model is a pickle, nor a zip holding one (torch.save's format),
    and MLflow builds its python model from a code file."""
    for path in (p for p in model_dir.rglob("*") if p.is_file()):
        assert path.suffix != ".pkl", path
        assert not _is_pickle(path.read_bytes()[:64]), path
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zipped:
                for member in zipped.namelist():
                    assert not member.endswith(".pkl"), f"{path}: {member}"
                    assert not _is_pickle(zipped.read(member)[:64]), f"{path}: {member}"
    pyfunc = mlflow.models.Model.load(str(model_dir)).flavors["python_function"]
    assert "python_model" not in pyfunc
    code_file = model_dir / Path(pyfunc["model_code_path"]).name
    assert code_file.suffix == ".py" and "mlflow.models.set_model(" in code_file.read_text()


def _log(tracking, converted, name, modality, items, label_names, tmp_path):
    """The point's model logged as a study logs it; returns its URI and its spec."""
    client, experiment_id = tracking
    inputs_dir = tmp_path / "inputs"
    inputs_dir.mkdir(exist_ok=True)
    modality.save(inputs_dir)
    run = client.create_run(experiment_id, run_name=name)
    deploy = deploy_config(OmegaConf.create({"deploy": DEPLOY}))
    spec = PointSpec(name, modality.name, label_names, deploy)
    uri = log_point_model(
        client,
        run.info.run_id,
        converted.artifact,
        spec,
        modality,
        inputs_dir,
        items[:2],
        "python -m tuner",
        converted.artifact.parent,
    )
    return uri, spec


def _served_matches_measured(
    name, model, recipe, modality, items, labels, label_names, serving_input, tracking, tmp_path
):
    example = modality.example(items, PROTOCOL)
    encoded = modality.encode(items, labels)
    calibration = [batch.inputs for batch in encoded.batches(32)][:2]
    converted = convert(name, model, recipe, example, DEPLOY, tmp_path / name, calibration)
    # The logits deployment measures the point's accuracy and agreement with.
    measured = collect_logits(converted.logits_of, encoded)

    uri, spec = _log(tracking, converted, name, modality, items, label_names, tmp_path)
    logged = tmp_path / "logged"
    logged.mkdir()
    _assert_no_pickle(Path(mlflow.artifacts.download_artifacts(uri, dst_path=str(logged))))
    served = mlflow.pyfunc.load_model(uri).predict(serving_input(items))
    best = torch.softmax(measured, dim=-1).max(dim=-1)
    assert list(served["label"]) == [spec.label_names[i] for i in best.indices.tolist()]
    np.testing.assert_allclose(served["score"].to_numpy(), best.values.double().numpy(), rtol=1e-6)


@pytest.mark.parametrize("name", _available("text"))
def test_served_text_model_reproduces_the_measured_logits(name, text_point, tracking, tmp_path):
    model, recipe, modality = text_point
    _served_matches_measured(
        name,
        model,
        recipe,
        modality,
        TEXTS,
        [i % 2 for i in range(len(TEXTS))],
        ["rotten", "fresh"],
        lambda items: pd.DataFrame({"text": items}),
        tracking,
        tmp_path,
    )


@pytest.mark.parametrize("name", _available("image"))
def test_served_image_model_reproduces_the_measured_logits(name, image_subject, tracking, tmp_path):
    from tuner.data import load_splits

    # The digits split the subject was trained and validated on.
    splits = load_splits(OmegaConf.load(REPO / "conf" / "data" / "digits.yaml"))
    modality = ImageModality.from_config(OmegaConf.create({"model": {"in_chans": 1}}), splits)
    items = np.asarray(splits.val.items[:150], dtype=np.float32)
    _served_matches_measured(
        name,
        image_subject.model,
        image_subject.recipe,
        modality,
        items,
        list(splits.val.labels[:150]),
        list(splits.label_names),
        lambda images: images,
        tracking,
        tmp_path,
    )


def _logged_files(model_uri: str) -> Path:
    """Where the tracking store (a local directory here) keeps a logged model's files."""
    model_id = model_uri.removeprefix("models:/")
    location = mlflow.MlflowClient().get_logged_model(model_id).artifact_location
    return Path(location.removeprefix("file://"))


def _log_the_earlier_way(monkeypatch) -> None:
    """`log_point_model` as earlier versions logged: a pickled `PointModel` object, of the class
    as it was named then (`tuner.serving.PointModel`), in place of the loader file, every other
    argument as it is."""
    log = mlflow.models.Model.log.__func__
    earlier = types.ModuleType("tuner.serving")
    earlier.PointModel = type("PointModel", (PointModel,), {"__module__": "tuner.serving"})
    monkeypatch.setitem(sys.modules, "tuner.serving", earlier)

    def pickled(cls, *args, **kwargs):
        return log(cls, *args, **{**kwargs, "python_model": earlier.PointModel()})

    monkeypatch.setattr(mlflow.models.Model, "log", classmethod(pickled))


def test_a_model_logged_with_a_pickle_loads_as_one_from_code(
    text_point, tracking, tmp_path, monkeypatch
):
    from tuner.deploy.on_demand import profile_logged
    from tuner.deploy.serving import load_point_model

    model, recipe, modality = text_point
    example = modality.example(TEXTS, PROTOCOL)
    converted = convert("eager", model, recipe, example, DEPLOY, tmp_path / "eager")
    labels = ["rotten", "fresh"]
    new_uri, _ = _log(tracking, converted, "eager", modality, TEXTS, labels, tmp_path)
    with monkeypatch.context() as patched:
        _log_the_earlier_way(patched)
        old_uri, _ = _log(tracking, converted, "eager", modality, TEXTS, labels, tmp_path)
    old_conf = mlflow.models.Model.load(old_uri).flavors["python_function"]
    assert old_conf["python_model"] == "python_model.pkl"
    pickled = _logged_files(old_uri) / "python_model.pkl"
    assert {"tuner.serving", "PointModel"} <= {
        a for _, a, _ in pickletools.genops(pickled.read_bytes())
    }

    # MLflow refuses to unpickle, so whatever loads is read without the pickle.
    monkeypatch.setenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "false")
    texts = pd.DataFrame({"text": TEXTS})
    old, new = load_point_model(old_uri), load_point_model(new_uri)
    assert isinstance(old.unwrap_python_model(), PointModel)
    assert list(old.predict(texts)["label"]) == list(new.predict(texts)["label"])
    # The logged model itself is left as it was logged.
    assert mlflow.models.Model.load(old_uri).flavors["python_function"] == old_conf
    params = {"latency.batch_size": "1", "latency.seq_len": "16", "latency.num_threads": "2"}
    for uri in (old_uri, new_uri):
        assert profile_logged(uri, TEXTS, params).profile.total_ms > 0


def test_a_model_whose_loader_names_the_earlier_module_loads(text_point, tracking, tmp_path):
    """A model from code logged before `PointModel` moved: its loader file, `serving_model.py`,
    imports `tuner.serving`. It loads with today's loader, and is left as it was logged."""
    from tuner.deploy.serving import load_point_model

    model, recipe, modality = text_point
    example = modality.example(TEXTS, PROTOCOL)
    converted = convert("eager", model, recipe, example, DEPLOY, tmp_path / "eager")
    labels = ["rotten", "fresh"]
    uri, _ = _log(tracking, converted, "eager", modality, TEXTS, labels, tmp_path)
    texts = pd.DataFrame({"text": TEXTS})
    expected = list(load_point_model(uri).predict(texts)["label"])
    # Rewritten in the tracking store as the earlier version logged it.
    logged = _logged_files(uri)
    (logged / "point_loader.py").unlink()
    earlier_loader = "import mlflow\n\nfrom tuner.serving import PointModel\n\n"
    (logged / "serving_model.py").write_text(
        earlier_loader + "mlflow.models.set_model(PointModel())\n"
    )
    mlmodel = (logged / "MLmodel").read_text()
    (logged / "MLmodel").write_text(mlmodel.replace("point_loader.py", "serving_model.py"))
    logged_as = mlflow.models.Model.load(uri).flavors["python_function"]["model_code_path"]
    assert Path(logged_as).name == "serving_model.py"

    assert list(load_point_model(uri).predict(texts)["label"]) == expected
    assert (logged / "serving_model.py").read_text().startswith(earlier_loader)


def test_a_quantised_artifact_saved_by_torch_save_still_loads(tiny_bert, tmp_path):
    """Quantised artifacts made before they were safetensors (torch.save of the state dict and
    the recipe) load as before, to the same model as the safetensors file."""
    from tuner.deploy.backends.int8_dynamic import _quantize
    from tuner.deploy.backends.support.torch_files import RECIPE_KEY, load_quantized, save_quantized

    quantized = _quantize(tiny_bert)
    earlier = tmp_path / "model.int8.pt"
    torch.save({RECIPE_KEY: TINY_BERT.to_json(), "state_dict": quantized.state_dict()}, earlier)
    now = save_quantized(quantized, TINY_BERT, tmp_path / "model.int8.safetensors")
    ids = torch.randint(0, 100, (2, 12))
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        expected = quantized(ids, mask)
        for artifact in (earlier, now):
            loaded = load_quantized(artifact, lambda model, saved: _quantize(model))
            torch.testing.assert_close(loaded(ids, mask), expected, rtol=0, atol=0)
