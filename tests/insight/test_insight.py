"""What a deployed model is made of: op classes, graph dumps of real artifacts, and the point's
MLflow run carrying them."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from conftest import REPO
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
        ("quantized.linear_dynamic", "matmul/conv"),
        ("aten.scaled_dot_product_attention", "attention"),
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
        # OpenVINO's CPU plugin layer types
        ("FullyConnected", "matmul/conv"),
        ("MVN", "norm"),
        ("MulAdd", "elementwise"),
        ("Reorder", "layout/memory"),
        ("FakeQuantize", "quantize"),
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

    from tuner.tracking.runs import Tracker

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


@pytest.mark.parametrize(
    ("calls", "kept", "left"),
    [
        (("product", "sum", "sum"), "aten::add", "aten::mm"),
        (("sum", "product", "product"), "aten::mm", "aten::add"),
    ],
)
def test_pytorchs_profile_keeps_the_call_of_median_length(calls, kept, left):
    import torch

    # Three profiled calls, each of one operator, in the order given: a product of two 512x512
    # matrices (134 million multiply-adds) or a sum of two 4-vectors, thousands of times
    # faster. Sorted by length, the middle call is of the kind that comes twice.
    square, vector = torch.randn(512, 512), torch.randn(4)
    kinds = iter(calls)

    def call():
        return square @ square if next(kinds) == "product" else vector + vector

    profile = profile_torch(call, ())
    calls_of = {op: count for op, count, _ in profile.rows}
    assert calls_of[kept] == 1 and left not in calls_of


def test_onnx_runtimes_profiler_sees_each_node_of_the_graph(tmp_path):
    import torch
    from omegaconf import OmegaConf

    from tuner.deploy.backends.support.onnx_export import profile_session

    shipped = OmegaConf.load(REPO / "conf" / "deploy" / "default.yaml")
    deploy = OmegaConf.merge(shipped, {"latency": {"num_threads": 1}})
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


def test_a_pytorch_graph_lists_the_operators_one_call_dispatches(tiny_bert):
    import warnings

    import torch

    from tuner.insight.graph import dispatched_graph

    ids = torch.randint(0, 100, (1, 16))
    mask = torch.ones(1, 16, dtype=torch.long)
    dump = dispatched_graph(tiny_bert.eval(), (ids, mask))
    # Two layers: two attention calls; per layer Q, K, V, output, two FFN projections, plus
    # the pooler and the head's two (dense, out): 2 * 6 + 3 linear layers.
    assert dump.ops["aten.scaled_dot_product_attention"] == 2
    assert dump.ops["aten.linear"] == 15
    assert dump.summary()["by_class"]["attention"] == 2
    assert dump.layout_ops > 0
    assert sum(dump.ops.values()) == len(dump.text.splitlines())
    # Shapes: the first FFN projection of a 16-token sequence, 32 -> 1536 wide.
    assert any(
        line.split()[1] == "aten.linear:" and line.endswith("-> 1x16x1536")
        for line in dump.text.splitlines()
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(
            tiny_bert, {torch.nn.Linear}, dtype=torch.qint8
        )
    # The same call quantised dispatches int8 matmuls in place of every fp32 one.
    int8 = dispatched_graph(quantized, (ids, mask))
    assert int8.ops["quantized.linear_dynamic"] == 15 and "aten.linear" not in int8.ops


def test_a_convolutional_graph_counts_its_convolutions_and_norms():
    import timm
    import torch

    from tuner.insight.graph import dispatched_graph

    model = timm.create_model("resnet18", num_classes=10, in_chans=1, pretrained=False).eval()
    dump = dispatched_graph(model, (torch.randn(1, 1, 28, 28),))
    # ResNet-18: the stem, 8 basic blocks of two convolutions, 3 downsampling shortcuts.
    assert dump.ops["aten.conv2d"] == 20
    assert dump.ops["aten.batch_norm"] == 20
    assert dump.summary()["by_class"]["pooling"] == 2  # max pool, global average pool


def test_flops_per_call_count_two_per_multiply_add():
    import torch

    from tuner.latency.peak import flops_per_call

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    # Batch 8: 8 * (64 * 256 + 256 * 2) multiply-adds.
    assert flops_per_call(model, (torch.randn(8, 64),)) == 2 * 8 * (64 * 256 + 256 * 2)


def test_flops_of_a_transformer_count_its_projections_ffn_and_attention(tiny_bert):
    import torch

    from tuner.latency.peak import flops_per_call

    ids, mask = torch.randint(0, 100, (1, 16)), torch.ones(1, 16, dtype=torch.long)
    tokens, hidden, ffn = 16, 32, 1536
    per_layer = (
        4 * 2 * tokens * hidden * hidden  # Q, K, V and output projections
        + 2 * 2 * tokens * hidden * ffn  # the two FFN projections
        + 2 * 2 * tokens * tokens * hidden  # Q K^T and the weighted sum of V, all heads
    )
    # Pooler and the head's dense layer on the first token, then 2 logits.
    head = 2 * hidden * hidden + 2 * hidden * hidden + 2 * hidden * 2
    assert flops_per_call(tiny_bert, (ids, mask)) == 2 * per_layer + head


def test_the_roofline_takes_the_lower_of_the_compute_and_memory_roofs():
    from tuner.insight.roofline import MachinePeak, roofline

    peak = MachinePeak({"fp32": 100.0, "bf16": 200.0, "int8": 400.0}, bandwidth_gbs=10.0, threads=2)
    # 2 GFLOP over 100 MB of weights: 20 FLOP/byte, 200 GFLOP/s under the memory roof; fp32's
    # 100 GFLOP/s is the lower roof. 2 GFLOP in 40 ms: 50 GFLOP/s, half of it.
    fp32 = roofline(2e9, 100e6, 40.0, "fp32", peak)
    assert fp32.bound == "compute"
    assert fp32.achieved_gflops == pytest.approx(50.0)
    assert fp32.fraction == pytest.approx(0.5)
    # Under int8 the compute roof is 400: memory (200) is the lower one.
    int8 = roofline(2e9, 100e6, 20.0, "int8", peak)
    assert int8.bound == "memory"
    assert int8.attainable_gflops == pytest.approx(200.0)
    assert int8.metrics() == {"achieved_gflops": pytest.approx(100.0), "roofline_fraction": 0.5}
    # No roof without FLOPs, weights, time or a peak for the precision.
    assert roofline(0.0, 100e6, 20.0, "int8", peak) is None
    assert roofline(2e9, 0.0, 20.0, "int8", peak) is None
    assert roofline(2e9, 100e6, 20.0, "fp16", peak) is None


def test_a_backend_names_a_precision_the_machine_has_a_peak_for():
    from tuner.deploy.backends import Backend

    with pytest.raises(ValueError, match="backend 'half': precision 'fp16' is not one of fp32"):
        Backend(name="half", export=None, load=None, precision="fp16")


def test_a_backend_without_a_graph_says_why_on_its_points():
    from tuner.deploy.backends import Backend
    from tuner.deploy.pipeline import graph_of

    with pytest.raises(ValueError, match="backend 'opaque': a backend names either how to"):
        Backend(name="opaque", export=None, load=None, graph=None)
    with pytest.raises(ValueError, match="backend 'both': .* not both or neither"):
        Backend(name="both", export=None, load=None, no_graph_reason="generated code")
    opaque = Backend(
        name="opaque", export=None, load=None, graph=None, no_graph_reason="runs generated code"
    )
    assert graph_of(opaque, None, None, None) == (None, "opaque runs generated code")


def test_the_machines_peaks_are_measured_in_the_order_the_hardware_implies():
    from tuner.latency.peak import measure_peak

    peak = measure_peak(threads=1)
    assert peak.threads == 1
    # A 2-core test machine does tens of GFLOP/s in fp32 and moves GB/s; more than 10 TFLOP/s
    # or 1 TB/s would mean a wrong unit.
    assert 1 < peak.gemm_gflops["fp32"] < 10_000
    assert 0.5 < peak.bandwidth_gbs < 1_000
    assert set(peak.gemm_gflops) == {"fp32", "bf16", "int8"}


def test_a_precision_whose_gemm_cannot_run_is_left_out_of_the_peak(monkeypatch):
    import torch

    from tuner.insight.roofline import roofline
    from tuner.latency.peak import measure_peak

    def no_int8_kernel(a, b):
        raise RuntimeError("_int_mm: no kernel for this CPU")

    monkeypatch.setattr(torch, "_int_mm", no_int8_kernel)
    peak = measure_peak(threads=1)
    assert set(peak.gemm_gflops) == {"fp32", "bf16"}
    # Its points have no roof; the other precisions' still do.
    assert roofline(2e9, 100e6, 20.0, "int8", peak) is None
    assert roofline(2e9, 100e6, 20.0, "fp32", peak) is not None


def test_a_study_measures_its_machines_peak_once_and_keeps_it(tmp_path):
    import optuna

    from tuner.insight.roofline import peak_key
    from tuner.keys import PEAK_ATTR_PREFIX
    from tuner.latency.peak import study_peak

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", directions=["maximize"])
    record = {"latency.cpu": "X", "latency.cpu_flags": "avx2", "latency.num_threads": 1}
    first = study_peak(study, record, threads=1)
    stored = [name for name in study.user_attrs if name.startswith(PEAK_ATTR_PREFIX)]
    assert stored == [f"{PEAK_ATTR_PREFIX}{peak_key(record)}"]
    # Read back, not measured again: the very same numbers.
    again = optuna.load_study(study_name=study.study_name, storage=f"sqlite:///{tmp_path}/s.db")
    assert study_peak(again, record, threads=1) == first
    # Another machine (other flags) is a key of its own.
    assert peak_key({**record, "latency.cpu_flags": "avx512f"}) != peak_key(record)
    assert peak_key({**record, "latency.batch_size": 4}) == peak_key(record)


def _point(number, backend, latency, profile_ms, layout_ops=10, flops=2e9, precision="fp32"):
    from tuner.front.points import Point
    from tuner.insight.point import PointInsight

    insight = PointInsight(profile_ms, layout_ops, flops, precision, peak_key="m")
    return Point(
        number, backend, 0.8, latency, latency, 100.0, number, pareto=True, insight=insight
    )


def test_the_breakdown_puts_two_points_side_by_side_and_names_the_biggest_difference():
    from rich.console import Console

    from tuner.front.compare import biggest_difference, breakdown
    from tuner.insight.roofline import MachinePeak

    chosen = _point(
        3, "onnxruntime_int8", 10.0, {"matmul/conv": 6.0, "layout/memory": 4.0}, precision="int8"
    )
    eager = _point(1, "eager", 40.0, {"matmul/conv": 30.0, "layout/memory": 5.0, "norm": 5.0}, 80)
    peaks = {"m": MachinePeak({"fp32": 100.0, "bf16": 100.0, "int8": 400.0}, 10.0, 2)}
    console = Console(record=True, width=200)
    console.print(breakdown([chosen, eager], peaks))
    text = console.export_text()
    assert "#3 onnxruntime_int8" in text and "#1 eager" in text
    assert "6.00 ms (60%)" in text and "30.00 ms (75%)" in text  # 6 of 10, 30 of 40
    assert "norm" in text and "0.00 ms (0%)" in text  # eager's third class, none on #3
    # 2 GFLOP over 100 MB: 20 FLOP/byte x 10 GB/s = 200 GFLOP/s under the memory roof; int8's
    # compute roof is 400, so memory bounds #3: 200 GFLOP/s achieved in 10 ms, all of it.
    assert "100.0% of 200 GFLOP/s (memory bandwidth)" in text
    # fp32's roof (100) is the lower for eager: 50 GFLOP/s achieved in 40 ms.
    assert "50.0% of 100 GFLOP/s (fp32 peak)" in text
    assert biggest_difference(chosen, eager) == (
        "Biggest difference: matmul/conv, 6.00 ms on #3 (onnxruntime_int8) against 30.00 ms "
        "on #1 (eager): 24.00 ms less per call."
    )
    unprofiled = _point(4, "compile", 5.0, {})
    assert biggest_difference(unprofiled, eager) is None
    alike = _point(5, "bf16", 30.0, {"matmul/conv": 30.0, "layout/memory": 5.0, "norm": 5.0})
    assert biggest_difference(alike, eager).endswith(
        "against 30.00 ms on #1 (eager): the same per call."
    )


def test_the_fronts_profile_picture_shows_each_profiled_front_point_by_class(tmp_path):
    from dataclasses import replace

    from tuner.front.insight_plots import plot_profile_html, plot_profile_png, profiled_front

    fast = _point(5, "onnxruntime_int8", 10.0, {"matmul/conv": 6.0, "quantize": 1.0})
    slow = _point(1, "eager", 40.0, {"matmul/conv": 30.0, "layout/memory": 5.0})
    dominated = replace(_point(2, "bf16", 50.0, {"matmul/conv": 40.0}), pareto=False)
    unprofiled = _point(6, "compile", 8.0, {})
    points = [slow, dominated, fast, unprofiled]
    assert [p.trial_number for p, _ in profiled_front(points)] == [5, 1]
    plot_profile_png(points, "study", tmp_path / "by_backend.png")
    assert (tmp_path / "by_backend.png").read_bytes()[:4] == b"\x89PNG"
    plot_profile_html(points, "study", tmp_path / "by_backend.html")
    html = (tmp_path / "by_backend.html").read_text()
    assert "#5 onnxruntime_int8 (10.0 ms)" in html and "#1 eager (40.0 ms)" in html
    assert "#2 bf16" not in html and "#6 compile" not in html
    assert "quantize: 1.00 ms (14%)" in html  # 1 of 7 ms
    # One trace per class that took time on a shown point, and none for the others.
    assert '"name":"quantize"' in html and '"name":"norm"' not in html


def test_a_points_insight_survives_its_trial_attribute():
    from tuner.insight.point import PointInsight

    insight = PointInsight({"matmul/conv": 1.5}, 7, 3e9, "int8", "abc")
    assert PointInsight.of_attr(insight.to_attr()) == insight
    assert PointInsight.of_attr(None) is None
    assert insight.top_classes(1) == [("matmul/conv", 1.5, 1.0)]


@pytest.mark.slow  # a new interpreter imports PyTorch and profiles: 4-6 s on 2 cores
def test_profiling_leaves_the_terminal_clean():
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from tuner.insight.profile import profile_torch\n"
        "profile_torch(torch.nn.Linear(8, 8), (torch.randn(2, 8),))\n"
        "profile_torch(torch.nn.Linear(8, 8), (torch.randn(2, 8),))\n"
        "print('after', file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    # No line of the profiler's own logging, and stderr works again afterwards.
    assert result.stderr == "after\n"


def test_a_machine_whose_peaks_cannot_be_measured_leaves_points_without_a_roofline(
    tmp_path, monkeypatch, capsys
):
    import optuna

    import tuner.study.parent_run
    from tuner.insight.point import PointInsight

    def no_int8_matmul(*args):
        raise RuntimeError("_int_mm is not implemented on this CPU")

    monkeypatch.setattr(tuner.study.parent_run, "study_peak", no_int8_matmul)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db")
    assert tuner.study.parent_run.machine_peak(study, {"latency.cpu": "X"}, 1) is None
    out = capsys.readouterr().out
    assert "_int_mm is not implemented on this CPU" in out and "without their roofline" in out
    # Its points keep everything else; the roofline reads as unknown, not as zero.
    insight = PointInsight({"matmul/conv": 1.0}, 3, 2e9, "int8", "abc")
    assert insight.roofline(10.0, 20.0, {}) is None
