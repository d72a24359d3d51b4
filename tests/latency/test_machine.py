"""What the CPU decides: bf16 availability (oneDNN's ISA cap included), ONNX Runtime's int8
weight range, the flags recorded with latencies, and resumes on a machine that runs other
backends."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from conftest import machine_runs
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution

from tuner.config.compose import compose_config, resolve
from tuner.config.space import SearchSpace
from tuner.deploy.backends import BACKENDS, unavailable_backends
from tuner.deploy.backends.support.onnx_export import int8_options
from tuner.errors import ConfigError
from tuner.latency.machine import isa_flags, native_bf16_unavailable, onednn_isa_cap
from tuner.study.checks import check_config
from tuner.study.opening import check_same_space


def _flags() -> set[str]:
    """This CPU's flags, read here independently of tuner.latency.machine."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("ALL", None),
        ("avx2", "AVX2"),
        (" AVX512_CORE_AMX ", "AVX512_CORE_AMX"),
    ],
)
def test_onednn_isa_cap_is_read_from_the_environment(value, expected, monkeypatch):
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if value is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", value)
    assert onednn_isa_cap() == expected


@pytest.mark.parametrize("cap", ["AVX2", "AVX512_CORE", "AVX512_CORE_VNNI"])
def test_bf16_is_unavailable_when_onednn_is_capped_below_its_bf16_kernels(cap, monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    reason = native_bf16_unavailable()
    assert reason is not None
    assert cap in reason or "no native bf16" in reason


@pytest.mark.parametrize("cap", ["AVX512_CORE_BF16", "AVX512_CORE_AMX", "DEFAULT"])
def test_bf16_follows_the_cpu_when_onednn_may_use_its_bf16_kernels(cap, monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    native = bool(_flags() & {"avx512_bf16", "amx_bf16"})
    assert (native_bf16_unavailable() is None) == native


def _deploy(reduce_range="auto"):
    settings = {"reduce_range": reduce_range, "weight_type": "int8", "per_channel": True}
    return OmegaConf.create({"onnx": {"int8": settings}})


def test_int8_weights_use_7_bits_exactly_where_the_cpu_has_no_vnni():
    vnni = bool(_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})
    assert int8_options(_deploy())["reduce_range"] is (not vnni)
    # A value set by the user is kept, whatever the CPU.
    assert int8_options(_deploy(reduce_range=True))["reduce_range"] is True
    assert int8_options(_deploy(reduce_range=False))["reduce_range"] is False


def test_recorded_flags_are_the_cpus_vector_instruction_sets():
    recorded = set(isa_flags().split())
    assert recorded <= _flags()
    assert {"avx2", "avx512f", "avx512_vnni", "amx_int8", "amx_bf16"} & _flags() <= recorded
    assert "sse2" not in recorded and "fpu" not in recorded


@pytest.mark.parametrize(
    ("key", "value", "rule"),
    [
        ("deploy.onnx.int8.reduce_range", "sometimes", "must be auto, true or false"),
        ("deploy.onnx.int8.weight_type", "int4", "must be int8 or uint8"),
        ("deploy.onnx.int8.per_channel", "yes", "must be true or false"),
        ("deploy.onnx.allow_spinning", "often", "must be true or false"),
    ],
)
def test_bad_int8_settings_are_refused_naming_the_key(key, value, rule):
    cfg = resolve(compose_config(["+experiment=bert_ffn", f"{key}={value}"]))
    with pytest.raises(ConfigError, match=f"key '{key}': '{value}' {rule}"):
        check_config(cfg, SearchSpace(), {})


def test_resume_on_a_machine_without_a_backend_says_which_and_why():
    study = optuna.create_study(directions=["maximize", "minimize"], study_name="s")
    earlier = CategoricalDistribution(["eager", "bf16"])
    study.add_trial(
        optuna.trial.create_trial(
            values=[0.5, 1.0],
            params={"deploy.backend": "bf16"},
            distributions={"deploy.backend": earlier},
        )
    )
    here = SearchSpace({"deploy.backend": CategoricalDistribution(["eager"])})
    with pytest.raises(ConfigError) as refused:
        check_same_space(study, here, {"deploy.backend": "exp.yaml"}, {"bf16": "no bf16 here"})
    message = str(refused.value)
    assert "study 's' deploys on choice(eager, bf16), this run would on choice(eager)" in message
    assert (
        "(bf16: no bf16 here); give the study's list (deploy.backends=[...]), resume it on a "
        "machine that runs the same backends"
    ) in message
    assert message.endswith("; defined in exp.yaml")
    # The same choices resume; keys the study has not sampled yet are free.
    check_same_space(study, SearchSpace({"deploy.backend": earlier}), {}, {})
    more = {"deploy.backend": earlier, "train.init": CategoricalDistribution(["auto"])}
    check_same_space(study, SearchSpace(more), {}, {})


def test_resume_that_drops_a_searched_key_is_refused():
    from optuna.distributions import IntDistribution

    study = optuna.create_study(directions=["maximize", "minimize"], study_name="s")
    width = IntDistribution(512, 1536, step=256)
    study.add_trial(
        optuna.trial.create_trial(
            values=[0.5, 1.0],
            params={"model.ffn_width": 1024},
            distributions={"model.ffn_width": width},
        )
    )
    fraction = SearchSpace({"model.ffn_width_fraction": CategoricalDistribution([0.5, 1.0])})
    with pytest.raises(
        ConfigError, match="key 'model.ffn_width': study 's' searched model.ffn_width"
    ):
        check_same_space(study, fraction, {}, {})
    # Fixed on the command line, the key is accounted for.
    check_same_space(study, SearchSpace(fixed={"model.ffn_width": 1024}), {}, {})


def test_an_unknown_cpu_is_treated_as_the_lowest_common_denominator(monkeypatch, capsys):
    from tuner.latency import machine as cpu
    from tuner.study.backends import runnable_backends

    assert cpu.unknown_cpu_notice() is None  # this machine's flags can be read
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset())
    # No instruction set is assumed: 7-bit int8 weights, no bf16, and a notice at start-up.
    assert int8_options(_deploy())["reduce_range"] is True
    assert native_bf16_unavailable() is not None
    runnable, left_out = runnable_backends(["eager", "bf16"], {})
    assert runnable == ["eager"] and "bf16" in left_out
    out = capsys.readouterr().out
    assert "could not be read" in out and "lowest common denominator" in out


@pytest.mark.parametrize(
    "environment",
    [
        {},
        # oneDNN capped below its bf16 kernels: bf16 is emulated, whatever the CPU.
        {"ONEDNN_MAX_CPU_ISA": "AVX2"},
        # No C++ compiler on PATH: Inductor cannot build torch.compile's kernels.
        {"PATH": "/nonexistent"},
    ],
)
def test_the_registry_leaves_out_the_backends_this_machine_lacks_what_they_need(
    environment, monkeypatch
):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    names = BACKENDS.names()
    left_out = unavailable_backends(names)
    # What each backend needs, worked out in the tests from the CPU flags, packages,
    # compilers and GPUs this machine shows (`conftest.machine_runs`).
    assert sorted(left_out) == sorted(name for name in names if not machine_runs(name))
    assert all(left_out.values())  # each with its reason
