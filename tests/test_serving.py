"""What ships is what was measured: for every backend this machine runs, the logged MLflow model
classifies raw validation examples exactly as the deployment that measured the point did."""

from __future__ import annotations

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from conftest import COMPILING, PROTOCOL, REPO, TINY_BERT, TINY_BERT_DIR
from omegaconf import OmegaConf
from test_backends import DEPLOY

from tuner.backends import BACKENDS, unavailable_backends
from tuner.deploy import convert
from tuner.modalities.image import ImageModality
from tuner.modalities.text import TextModality
from tuner.serving import PointSpec, deploy_config, log_point_model
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
            + ([pytest.mark.slow] if name in COMPILING else [])
            + ([pytest.mark.gpu] if BACKENDS.get(name).device == "cuda" else []),
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


def _served_matches_measured(
    name, model, recipe, modality, items, labels, label_names, serving_input, tracking, tmp_path
):
    client, experiment_id = tracking
    example = modality.example(items, PROTOCOL)
    encoded = modality.encode(items, labels)
    calibration = [batch.inputs for batch in encoded.batches(32)][:2]
    converted = convert(name, model, recipe, example, DEPLOY, tmp_path / name, calibration)
    # The logits deployment measures the point's accuracy and agreement with.
    measured = collect_logits(converted.logits_of, encoded)

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
