"""Deploying on a GPU (`deploy.device`, the `cuda_*` backends): what can be checked on a
machine without one. The GPU path itself is exercised by scripts/gpu_check.sh."""

from __future__ import annotations

import pytest
import torch
from conftest import run_cli
from omegaconf import OmegaConf

from tuner.config.compose import compose_config, resolve
from tuner.config.space import SearchSpace
from tuner.deploy.backends import BACKENDS, Backend
from tuner.errors import ConfigError
from tuner.latency.protocol import gpu_record
from tuner.study.backends import check_backends
from tuner.study.checks import check_config

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="about machines without a GPU")
CUDA_BACKENDS = ["cuda_bf16", "cuda_compile", "cuda_eager", "cuda_fp16"]


def test_the_gpu_backends_deploy_on_cuda_in_their_precisions():
    gpu = {name: BACKENDS.get(name) for name in BACKENDS.names() if name.startswith("cuda_")}
    assert sorted(gpu) == CUDA_BACKENDS
    assert all(backend.device == "cuda" for backend in gpu.values())
    precisions = {name: backend.precision for name, backend in gpu.items()}
    assert precisions == {
        "cuda_bf16": "bf16",
        "cuda_compile": "fp32",
        "cuda_eager": "fp32",
        "cuda_fp16": "fp16",
    }
    # Every other backend deploys on the CPU.
    assert {BACKENDS.get(n).device for n in BACKENDS.names() if n not in gpu} == {"cpu"}


def test_fp16_is_a_gpu_precision_only():
    Backend(name="half", export=None, load=None, precision="fp16", device="cuda")
    with pytest.raises(ValueError, match="precision 'fp16' is not one of fp32, bf16, int8"):
        Backend(name="half", export=None, load=None, precision="fp16")
    with pytest.raises(ValueError, match="device 'tpu' is not one of cpu, cuda"):
        Backend(name="tpu", export=None, load=None, device="tpu")


def test_a_gpu_backend_in_a_cpu_study_is_refused_naming_both():
    with pytest.raises(
        ConfigError,
        match="'cuda_fp16' deploys on cuda, but this study deploys on cpu \\(deploy.device=cpu\\)",
    ):
        check_backends(["eager", "cuda_fp16"], "text", OmegaConf.create({"device": "cpu"}), {})


@NO_GPU
def test_deploying_on_a_gpu_where_there_is_none_is_refused():
    with pytest.raises(ConfigError, match="key 'deploy.device': 'cuda:1' asks for a GPU, but"):
        check_backends(["cuda_eager"], "text", OmegaConf.create({"device": "cuda:1"}), {})


@pytest.mark.parametrize("device", ["auto", "gpu", "cuda:"])
def test_a_deploy_device_that_is_no_device_is_refused(device):
    cfg = resolve(compose_config(["+experiment=bert_ffn", f"deploy.device='{device}'"]))
    with pytest.raises(ConfigError, match="key 'deploy.device'.* must be cpu, cuda or cuda:N"):
        check_config(cfg, SearchSpace(), {})


def test_a_cpu_study_records_no_gpu_with_its_latencies():
    assert gpu_record("cpu", prefix="latency.") == {}


# Through the real command line (a subprocess each: the full suite's).
@pytest.mark.slow
@NO_GPU
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("deploy.device=cuda", "deploy.backend=cuda_eager"),
            "key 'deploy.device': 'cuda' asks for a GPU, but",
        ),
        (
            ("deploy.backend=cuda_fp16",),
            "'cuda_fp16' deploys on cuda, but this study deploys on cpu",
        ),
    ],
)
def test_the_cli_stops_before_anything_is_created(overrides, message, tmp_path):
    result = run_cli(tmp_path, "+experiment=bert_ffn", "debug=smoke", *overrides, timeout=300)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / "mlruns").exists()
