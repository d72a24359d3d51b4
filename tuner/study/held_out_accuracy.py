"""A point's accuracy on the held-out test split, as `python -m tuner.report` checks a
recommended point once: evaluated once per split and kept on the point's MLflow run beside the
split's data fingerprint, so a value measured on another split is never reused."""

from __future__ import annotations

from collections.abc import Callable

import mlflow

from tuner import console
from tuner.data import Splits
from tuner.deploy import load_point_model
from tuner.front import Point
from tuner.keys import TEST_EXAMPLES_TAG, TEST_SPLIT_TAG
from tuner.modalities import MODALITIES
from tuner.tracking import set_run_tags

TEST_METRIC = "test_accuracy"


def cached_test_accuracy(
    run: mlflow.entities.Run, test_split: str, data_changed: bool
) -> float | None:
    """The test accuracy kept on a point's run, if it was measured on the split `test_split`
    fingerprints. One kept without its split was measured before runs recorded it: on the
    study's only split where `data_changed` is false, on an unknown one otherwise."""
    recorded = run.data.metrics.get(TEST_METRIC)
    measured_on = run.data.tags.get(TEST_SPLIT_TAG)
    if recorded is None:
        return None
    if measured_on == test_split or (measured_on is None and not data_changed):
        return recorded
    return None


def test_accuracy(
    point: Point,
    splits_of: Callable[[], Splits],
    client: mlflow.MlflowClient,
    test_split: str,
    data_changed: bool,
) -> float:
    """The point's accuracy on the test split (`test_split`: its data fingerprint), evaluated
    once per split and kept on its MLflow run beside the fingerprint."""
    assert point.model_uri is not None and point.mlflow_run_id is not None
    recorded = cached_test_accuracy(client.get_run(point.mlflow_run_id), test_split, data_changed)
    if recorded is not None:
        console.console.print(f"Test accuracy was evaluated before; reusing {recorded:.4f}.")
        return recorded
    splits = splits_of()
    console.console.print(
        f"Evaluating trial #{point.trial_number} ({point.backend}) on {len(splits.test)} "
        "held-out test examples ..."
    )
    model = load_point_model(point.model_uri)
    test_input = MODALITIES.get(splits.modality).serving_input(splits.test.items)
    predicted = model.predict(test_input)["label"].tolist()
    expected = [splits.label_names[label] for label in splits.test.labels]
    accuracy = sum(p == e for p, e in zip(predicted, expected, strict=True)) / len(expected)
    client.log_metric(point.mlflow_run_id, TEST_METRIC, accuracy)
    tags = {TEST_SPLIT_TAG: test_split, TEST_EXAMPLES_TAG: str(len(expected))}
    set_run_tags(client, point.mlflow_run_id, tags)
    return accuracy
