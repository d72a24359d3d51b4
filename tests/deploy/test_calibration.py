"""What calibration changes in an int8 artifact: its ranges, not its graph. Rebuilt artifacts,
which are only timed (`tuner.study.confirmation.Rebuilder`), calibrate on one batch."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
import pytest
from conftest import Subject, machine_runs
from test_backends import DEPLOY, _deploy_subject

from tuner.deploy.backends import BACKENDS
from tuner.study.confirmation import TIMING_CALIBRATION_BATCHES

# The backends that calibrate activation ranges on training batches (`calibration_batches`)
# and whose graph is the architecture's, not the weights' (so a rebuild is timed for them).
# NNCF's quantisation of the three artifacts takes 4-6 s on 2 cores: that case is `slow`.
CALIBRATING = [
    "onnxruntime_int8_static",
    pytest.param("openvino_int8", marks=pytest.mark.slow),
]


def _operations(artifact: Path) -> Counter[str]:
    """How many operations of each type the artifact's graph holds."""
    if (artifact / "model.xml").exists():
        import openvino as ov

        model = ov.Core().read_model(artifact / "model.xml")
        return Counter(op.get_type_name() for op in model.get_ops())
    (graph,) = [artifact] if artifact.suffix == ".onnx" else list(artifact.glob("*.onnx"))
    return Counter(node.op_type for node in onnx.load(str(graph)).graph.node)


@pytest.mark.parametrize("name", CALIBRATING)
def test_one_calibration_batch_builds_the_graph_many_build(name, text_subject, tmp_path):
    if not machine_runs(name):
        pytest.skip(f"{name} does not run on this machine")
    assert not BACKENDS.get(name).follows_weights(DEPLOY)
    assert len(text_subject.calibration) == 3
    many = _deploy_subject(name, text_subject, tmp_path / "many")
    few = Subject(
        text_subject.model,
        text_subject.recipe,
        text_subject.val_data,
        text_subject.example,
        text_subject.calibration[:TIMING_CALIBRATION_BATCHES],
    )
    one = _deploy_subject(name, few, tmp_path / "one")
    assert many.error is None and one.error is None, (many.error, one.error)
    counted = _operations(many.artifact)
    # Quantised: the graph holds int8 operations, in the same places whatever the ranges.
    assert any("Quantize" in op or op == "FakeQuantize" for op in counted), counted
    assert _operations(one.artifact) == counted
