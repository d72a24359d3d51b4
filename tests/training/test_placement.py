"""Where models train (`train.device`) and in what precision (`train.precision`): what can be
checked on a machine without a GPU. The CUDA path itself is exercised by
scripts/gpu_check.sh on a GPU machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import REPO, run_cli, separable_texts, train_cfg
from omegaconf import OmegaConf
from torch import nn

from tuner.config.compose import compose_config, resolve
from tuner.config.space import build_search_space
from tuner.devices import describe
from tuner.errors import ConfigError
from tuner.study.checks import check_config
from tuner.training import Placement
from tuner.training.loop import _step

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="about machines without a GPU")


def _cpu_has_native_bf16() -> bool:
    flags = Path("/proc/cpuinfo").read_text().split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _checked(*overrides: str, space: dict | None = None) -> None:
    cfg = resolve(compose_config(["+experiment=bert_ffn", *overrides]))
    check_config(cfg, build_search_space(space or {}, cfg), {})


@NO_GPU
def test_auto_trains_on_the_cpu_of_a_machine_without_a_gpu():
    placement = Placement.of(train_cfg(device="auto"))
    assert placement.device == torch.device("cpu")
    assert describe(placement.device) == "cpu"


@NO_GPU
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_a_gpu_asked_for_where_there_is_none_is_refused_naming_the_key(device):
    with pytest.raises(ConfigError, match=f"key 'train.device': '{device}' asks for a GPU, but"):
        _checked(f"train.device={device}")


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "CPU", ""])
def test_a_device_that_is_no_device_is_refused(device):
    with pytest.raises(ConfigError, match="key 'train.device'.* must be auto, cpu, cuda or cuda:N"):
        _checked(f"train.device='{device}'")


def test_a_searched_device_is_checked_too():
    with pytest.raises(ConfigError, match="key 'train.device' \\(a value of its search space\\)"):
        _checked(space={"train.device": "choice(cpu, gpu)"})


def test_fp16_training_is_refused_on_a_cpu():
    with pytest.raises(ConfigError, match="key 'train.precision': 'fp16' cannot train on cpu"):
        _checked("train.device=cpu", "train.precision=fp16")


def test_an_unknown_precision_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="key 'train.precision': unknown value 'fp8'; choose"):
        _checked("train.precision=fp8")


def test_bf16_training_on_a_cpu_follows_its_native_bf16_instructions():
    if _cpu_has_native_bf16():
        _checked("train.device=cpu", "train.precision=bf16")
    else:
        with pytest.raises(ConfigError, match="'bf16' cannot train on cpu: .*bf16"):
            _checked("train.device=cpu", "train.precision=bf16")


@pytest.mark.skipif(not _cpu_has_native_bf16(), reason="needs native bf16 instructions")
def test_bf16_autocast_trains_a_tiny_bert_on_the_cpu(tiny_bert):
    from tuner.training import batch_loss, train

    model, data = tiny_bert, separable_texts()
    cfg = train_cfg(precision="bf16", epochs=3, lr=3e-3)
    before = [p.detach().clone() for p in model.parameters()]
    result = train(model, data, data, cfg, batch_loss("text", cfg, 2))
    assert result.trained_on == "cpu"
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    # Its own training examples: a tiny BERT learns them in three epochs.
    assert result.val_accuracy > 0.7


def _linear(weights: list[float]) -> nn.Linear:
    model = nn.Linear(len(weights), 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([weights]))
    return model


def test_a_scaled_step_clips_the_true_gradients_by_their_global_norm():
    # loss = w . (1, 1): gradient (1, 1), norm sqrt(2), clipped to norm 1: (0.7071, 0.7071);
    # SGD at lr 0.1 moves each weight by -0.07071, whatever the scale the loss was scaled by.
    model = _linear([3.0, 4.0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    _step(model, model(torch.ones(1, 2)).sum(), optimizer, scaler, grad_clip_norm=1.0)
    assert model.weight.detach().tolist()[0] == pytest.approx([2.92929, 3.92929], abs=1e-5)


def test_a_scaled_step_whose_gradients_overflow_is_skipped_and_the_scale_halved():
    model = _linear([3.0, 4.0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    # 1e36 * 65536 overflows fp32: the gradients are inf.
    _step(model, 1e36 * model(torch.ones(1, 2)).sum(), optimizer, scaler, grad_clip_norm=0.0)
    assert model.weight.detach().tolist()[0] == [3.0, 4.0]
    assert scaler.get_scale() == 2.0**15


@pytest.mark.slow  # through the real command line
@NO_GPU
def test_the_cli_stops_before_training_when_the_gpu_is_missing(tmp_path):
    result = run_cli(
        tmp_path, "+experiment=bert_ffn", "debug=smoke", "train.device=cuda", timeout=300
    )
    assert result.returncode == 2, result.stderr
    assert "key 'train.device': 'cuda' asks for a GPU" in result.stderr
    # Nothing was created: no study, no MLflow runs.
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / "mlruns").exists()


def test_the_shipped_default_is_auto_in_fp32():
    shipped = OmegaConf.load(REPO / "conf" / "train" / "default.yaml")
    assert (shipped.device, shipped.precision) == ("auto", "fp32")
