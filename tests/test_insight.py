"""What a deployed model is made of: op classes, graph dumps of real artifacts, and the point's
MLflow run carrying them."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tuner.insight.graph import onnx_graph
from tuner.insight.op_classes import OP_CLASSES, by_class, op_class
from tuner.insight.profile import OpProfile, profile_torch


@pytest.mark.parametrize(
    ("op_type", "expected"),
    [
        ("MatMul", "matmul/conv"),
        ("MatMulInteger", "matmul/conv"),
        ("FusedConv", "matmul/conv"),
        ("aten::linear", "matmul/conv"),
        ("aten.addmm.default", "matmul/conv"),
        ("QAttention", "attention"),
        ("Softmax", "attention"),
        ("SkipLayerNormalization", "norm"),
        ("aten::batch_norm", "norm"),
        ("BiasGelu", "activation"),
        ("Add", "elementwise"),
        ("GlobalAveragePool", "pooling"),
        ("Transpose", "layout/memory"),
        ("aten::permute", "layout/memory"),
        ("ReorderInput", "layout/memory"),
        ("DynamicQuantizeLinear", "quantize"),
        ("SomeNewKernel", "other"),
    ],
)
def test_each_op_type_has_its_class(op_type, expected):
    assert op_class(op_type) == expected


def test_amounts_are_summed_per_class_with_every_class_listed():
    totals = by_class([("MatMul", 2.5), ("Gemm", 1.0), ("Transpose", 0.5), ("Mystery", 1.0)])
    assert list(totals) == list(OP_CLASSES)
    assert totals["matmul/conv"] == 3.5
    assert totals["layout/memory"] == 0.5
    assert totals["other"] == 1.0
    assert sum(totals.values()) == 5.0


def _small_graph(path: Path) -> Path:
    """x @ w, transposed, reshaped, ReLU, plus itself: five nodes, two of them layout ops."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 3], [0.1] * 9)
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [3, 2])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
        helper.make_node("Transpose", ["a"], ["b"], name="t"),
        helper.make_node("Reshape", ["b", "shape"], ["c"], name="r"),
        helper.make_node("Relu", ["c"], ["d"], name="act"),
        helper.make_node("Add", ["d", "d"], ["y"], name="sum"),
    ]
    graph = helper.make_graph(nodes, "small", [x], [y], initializer=[w, shape])
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_an_onnx_graph_is_counted_by_type_and_class_and_listed_in_order(tmp_path):
    dump = onnx_graph(_small_graph(tmp_path / "small.onnx"))
    assert dump.ops == {"MatMul": 1, "Transpose": 1, "Reshape": 1, "Relu": 1, "Add": 1}
    assert dump.layout_ops == 2
    summary = dump.summary()
    assert summary["nodes"] == 5
    assert summary["by_class"] == {
        "matmul/conv": 1,
        "activation": 1,
        "elementwise": 1,
        "layout/memory": 2,
    }
    assert summary["ops"]["Transpose"] == {"count": 1, "class": "layout/memory"}
    lines = dump.text.splitlines()
    assert [line.split()[1] for line in lines] == ["MatMul", "Transpose", "Reshape", "Relu", "Add"]
    assert lines[2].endswith("r: b, shape -> c")


def test_the_graph_is_logged_on_the_points_run(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from tuner.tracking import Tracker

    monkeypatch.chdir(tmp_path)  # MLflow's artifacts go under the working directory
    dump = onnx_graph(_small_graph(tmp_path / "small.onnx"))
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "study")
    parent = tracker.start_parent("study", {}, "")
    run_id = tracker.start_trial(parent, "study", 0, "onnxruntime", {}, trained_in_trial=0)
    tracker.log_graph(run_id, dump)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    ops = client.download_artifacts(run_id, "graph/ops.json", str(tmp_path))
    assert json.loads(Path(ops).read_text())["layout_ops"] == 2
    text = client.download_artifacts(run_id, "graph/graph.txt", str(tmp_path))
    assert Path(text).read_text() == dump.text


def test_a_profile_lists_ops_slowest_first_and_sums_them_per_class():
    profile = OpProfile.of([("Transpose", 2, 1.0), ("Relu", 1, 0.25), ("MatMul", 2, 3.0)])
    assert profile.rows == (("MatMul", 2, 3.0), ("Transpose", 2, 1.0), ("Relu", 1, 0.25))
    assert profile.total_ms == 4.25
    assert profile.metrics() == {
        "profile.matmul_conv_ms": 3.0,
        "profile.activation_ms": 0.25,
        "profile.layout_memory_ms": 1.0,
        "profile.total_ms": 4.25,
    }
    lines = profile.csv().splitlines()
    assert lines[0] == "op_type,class,calls,total_ms,share"
    assert lines[1] == "MatMul,matmul/conv,2,3.0000,0.7059"  # 3 / 4.25


def test_pytorchs_profiler_sees_the_matmuls_of_one_call():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    profile = profile_torch(model, (torch.randn(8, 64),))
    by_class = profile.by_class_ms()
    assert by_class["matmul/conv"] > 0 and by_class["activation"] > 0
    assert sum(by_class.values()) == pytest.approx(profile.total_ms)


def test_onnx_runtimes_profiler_sees_each_node_of_the_graph(tmp_path):
    import torch
    from omegaconf import OmegaConf

    from tuner.backends.onnx_export import profile_session

    deploy = OmegaConf.create({"latency": {"num_threads": 1}})
    graph = _small_graph(tmp_path / "small.onnx")
    profile = profile_session(graph, deploy, (torch.ones(2, 3),))
    # One call: each of the five nodes once.
    assert sorted((op, calls) for op, calls, _ in profile.rows) == [
        ("Add", 1),
        ("MatMul", 1),
        ("Relu", 1),
        ("Reshape", 1),
        ("Transpose", 1),
    ]
    assert profile.total_ms > 0
