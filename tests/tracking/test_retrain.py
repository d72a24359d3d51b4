"""The retrain command: the invocation's overrides with the point's values pinned."""

from __future__ import annotations

from tuner.tracking import retrain_overrides


def test_a_point_retrains_on_its_own_backend_without_the_list_it_was_deployed_on():
    """`deploy.backends` and a pinned `deploy.backend` may not be set together, so the list the
    invocation deployed on gives way to the point's backend."""
    overrides = retrain_overrides(
        ["+experiment=bert_ffn", "deploy.backends=[eager,openvino_int8]", "train.epochs=1"],
        {"deploy.backend": "openvino_int8", "train.lr": 0.001},
        "bert_ffn",
        "3-openvino_int8",
    )
    assert overrides == [
        "+experiment=bert_ffn",
        "train.epochs=1",
        "deploy.backend=openvino_int8",
        "train.lr=0.001",
        "study.n_trials=1",
        "study.name=bert_ffn-retrain-3-openvino_int8",
    ]
