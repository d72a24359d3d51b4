"""Rebuilding points to time them again (`tuner.study.confirmation.Rebuilder`): one untrained
model and one export for every backend of a configuration, as a trial's backends share them."""

from __future__ import annotations

import pytest
import torch
from conftest import PROTOCOL, TINY_BERT_DIR, machine_runs, text_example
from torch import nn

from tuner.config import compose_config
from tuner.config.compose import resolve
from tuner.study.confirmation import Rebuilder, Target
from tuner.study.preparation import protocol_record_of
from tuner.trial import ModelFactory

BACKENDS = [b for b in ("onnxruntime", "onnxruntime_int8", "openvino") if machine_runs(b)]


class CountingFactory(ModelFactory):
    """The real factory, counting the models it hands out."""

    def __init__(self, num_labels: int) -> None:
        super().__init__(num_labels)
        self.built = 0

    def build(self, model_cfg, seed: int) -> nn.Module:
        self.built += 1
        return super().build(model_cfg, seed)


def _targets(fraction: float, first: int) -> list[Target]:
    """One configuration's points: the same params but for the backend."""
    return [
        Target(
            f"#{first + i} {backend}",
            {"model.ffn_width_fraction": fraction, "deploy.backend": backend},
            backend,
            None,
        )
        for i, backend in enumerate(BACKENDS)
    ]


def test_a_configuration_s_backends_share_one_model_and_one_export(val_data, tmp_path):
    if len(BACKENDS) < 2:
        pytest.skip("fewer than two ONNX backends run on this machine")
    cfg = resolve(
        compose_config(
            [
                "+experiment=bert_ffn",
                f"model.name_or_path={TINY_BERT_DIR}",
                "model.random_init=true",
            ]
        )
    )
    example = text_example(val_data)
    factory = CountingFactory(2)
    rebuilder = Rebuilder(cfg, factory, example, [], protocol_record_of(cfg, PROTOCOL, example))
    targets = _targets(0.5, 0) + _targets(0.25, len(BACKENDS))
    rebuilt = rebuilder.rebuild(targets, tmp_path)
    assert rebuilt.skipped == {}
    assert sorted(rebuilt.loaded) == sorted(t.label for t in targets)
    # Two configurations: two models, each converted in one directory of its own, where its
    # backends share one fp32 ONNX export.
    assert factory.built == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "1"]
    for directory in tmp_path.iterdir():
        exports = [p for p in directory.rglob("*.onnx") if p.name == "model.fp32.onnx"]
        assert len(exports) == 1, exports
    # Each configuration's structure is its own, the same for each of its backends.
    structures = [rebuilt.keys[t.label]["structure"] for t in targets]
    assert len(set(structures[: len(BACKENDS)])) == len(set(structures[len(BACKENDS) :])) == 1
    assert structures[0] != structures[-1]
    with torch.inference_mode():
        assert all(call(*example.tensors).shape == (1, 2) for call in rebuilt.loaded.values())
