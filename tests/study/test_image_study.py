"""The image experiment end to end on digits (`+experiment=resnet_mixup debug=smoke
data=digits`, real subprocesses): trials, two backends, a deployable image model, the report;
and the modality checks that stop a mismatched study before anything is created."""

from __future__ import annotations

import sys

import mlflow
import numpy as np
import optuna
import pytest
import warm
from conftest import run_cli
from mlflow.tracking import MlflowClient

from tuner.config.compose import apply_debug, compose_config, resolve
from tuner.data import load_splits
from tuner.deploy.backends import BACKENDS
from tuner.front.points import study_points
from tuner.keys import ARCHITECTURE_ATTR, ROLE_TAG, TEACHER_OF_ATTR

SMOKE = (
    "+experiment=resnet_mixup",
    "debug=smoke",
    "data=digits",
    # Two of the experiment's backends: a dict override merges into the search space.
    "search_space={deploy.backend:'choice(eager,int8_static)'}",
)
STUDY = "resnet_mixup-smoke"
_UNAVAILABLE = BACKENDS.get("int8_static").unavailable_reason()
# Real studies in subprocesses (the full suite's, not the fast selection's), on int8_static; in
# one process of a parallel run, which runs the study they read once.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("image_study"),
    pytest.mark.skipif(
        _UNAVAILABLE is not None, reason=f"int8_static is unavailable here: {_UNAVAILABLE}"
    ),
]


@pytest.fixture(scope="module")
def image_study(tmp_path_factory):
    path = tmp_path_factory.mktemp("images")
    result = run_cli(path, *SMOKE)
    assert result.returncode == 0, result.stderr
    return path, result


def test_image_study_trains_and_deploys_on_both_backends(image_study):
    path, result = image_study
    assert "sklearn.datasets.load_digits" in result.stdout
    # Library spam (quantisation deprecations, MLflow, ONNX Runtime) stays quiet.
    assert "Warning" not in result.stderr, result.stderr
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{path}/optuna.db")
    points = study_points(study)
    # 2 trained configurations x 2 backends, each a complete point.
    assert len(points) == 4 and {p.backend for p in points} == {"eager", "int8_static"}
    assert all(0 < p.val_accuracy <= 1 and p.latency_ms > 0 for p in points)
    # The first configuration is the distillation teacher: the full-width CNN, unsampled.
    teacher = [t for t in study.get_trials() if TEACHER_OF_ATTR in t.user_attrs]
    assert len(teacher) == 2 and {t.user_attrs["trained_in_trial"] for t in teacher} == {0}
    assert all(
        t.user_attrs[ARCHITECTURE_ATTR] == {} for t in teacher
    )  # a CNN: no width or depth edit
    for trial in study.get_trials():
        if trial in teacher:
            continue
        # The shared training knobs and the CNN's own structure were searched together.
        assert {"train.mixup_alpha", "train.cutmix_alpha", "model.width_multiplier"} <= set(
            trial.params
        )
    client = MlflowClient(f"sqlite:///{path}/mlflow.db")
    experiment = client.get_experiment_by_name(STUDY)
    parent = next(
        r
        for r in client.search_runs([experiment.experiment_id])
        if r.data.tags.get(ROLE_TAG) == "study"
    )
    assert parent.data.params["latency.input_shape"] == "1x1x8x8"


def test_image_points_record_their_convolutions_and_roofline(image_study):
    import json

    path, _ = image_study
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{path}/optuna.db")
    client = MlflowClient(f"sqlite:///{path}/mlflow.db")
    flops = {}
    for point in study_points(study):
        insight = point.insight
        assert insight is not None and insight.profile_ms["matmul/conv"] > 0
        assert insight.precision == ("int8" if point.backend == "int8_static" else "fp32")
        flops.setdefault(point.trained_in_trial, set()).add(insight.flops)
        ops = json.loads(
            open(client.download_artifacts(point.mlflow_run_id, "graph/ops.json", str(path))).read()
        )["ops"]
        # The shipped model's convolutions: fp32 ones eagerly, quantised ones in int8.
        convolutions = [op for op, found in ops.items() if found["class"] == "matmul/conv"]
        if point.backend == "eager":
            assert "aten.conv2d" in convolutions and "aten.batch_norm" in ops
        else:
            assert any(op.startswith("quantized.conv2d") for op in convolutions), convolutions
        assert 0 < client.get_run(point.mlflow_run_id).data.metrics["roofline_fraction"] <= 1.5
    # FLOPs are the architecture's: one count per trained model, and the teacher (#0, the
    # full ResNet-18) does more arithmetic per call than a student narrowed or made shallower.
    (teacher,), (student,) = flops[0], flops[max(flops)]
    params = study.trials[max(flops)].params
    shrunken = params.get("model.width_multiplier", 1.0) < 1 or params.get("model.depth", 2) < 2
    assert teacher > student > 0 if shrunken else teacher == student


def test_image_points_are_served_from_pixel_arrays(image_study):
    path, _ = image_study
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{path}/optuna.db")
    front = [p for p in study_points(study) if p.pareto]
    cfg = resolve(apply_debug(compose_config(SMOKE)))
    splits = load_splits(cfg.data)
    mlflow.set_tracking_uri(f"sqlite:///{path}/mlflow.db")
    for point in front:
        model = mlflow.pyfunc.load_model(point.model_uri)
        inputs = model.metadata.signature.inputs.inputs[0]
        assert inputs.shape == (-1, 8, 8) and inputs.type == np.dtype(np.float32)
        # Raw pixels in (0-16 for digits); the model reproduces the point's validation accuracy.
        predicted = model.predict(np.asarray(splits.val.items, dtype=np.float32))
        truth = [splits.label_names[label] for label in splits.val.labels]
        accuracy = float((predicted["label"] == truth).mean())
        assert accuracy == pytest.approx(point.val_accuracy, abs=1.5 / len(truth))
        assert predicted["score"].between(0, 1).all()


def test_report_evaluates_the_recommended_image_point_on_the_test_split(image_study):
    path, _ = image_study
    command = [
        sys.executable,
        "-m",
        "tuner.report",
        *SMOKE,
        f"study.storage=sqlite:///{path}/optuna.db",
        f"tracking.uri=sqlite:///{path}/mlflow.db",
    ]
    result = warm.run(command, cwd=path, capture_output=True, text=True, timeout=600)
    # The default rule always has a point: at worst the most accurate one.
    assert result.returncode == 0, result.stderr
    splits = load_splits(resolve(apply_debug(compose_config(SMOKE))).data)
    assert f"on {len(splits.test)} held-out test examples" in result.stdout
    client = MlflowClient(f"sqlite:///{path}/mlflow.db")
    experiment = client.get_experiment_by_name(STUDY)
    tested = [
        r.data.metrics["test_accuracy"]
        for r in client.search_runs([experiment.experiment_id])
        if "test_accuracy" in r.data.metrics
    ]
    assert len(tested) == 1 and 0 <= tested[0] <= 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("+experiment=bert_ffn", "debug=smoke", "data=digits"),
            "key 'model.family': 'hf_encoder' models read text, but data.source 'digits' "
            "gives image",
        ),
        (
            ("+experiment=bert_ffn", "debug=smoke", "deploy.backend=channels_last"),
            "key 'deploy.backend': 'channels_last' deploys image models, not text ones",
        ),
        (
            ("+experiment=bert_ffn", "debug=smoke", "train.cutmix_alpha=1.0"),
            "key 'train.cutmix_alpha': cutmix cuts and pastes image patches",
        ),
        (
            (*SMOKE, "model.in_chans=3"),
            "key 'model.in_chans': 3, but the images of sklearn.datasets.load_digits have 1",
        ),
    ],
)
def test_modality_mismatches_stop_before_anything_is_created(tmp_path, overrides, message):
    result = run_cli(tmp_path, *overrides)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr.replace("\n", " ")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "optuna.db").exists()
    assert not (tmp_path / "mlflow.db").exists()
