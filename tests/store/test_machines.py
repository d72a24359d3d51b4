"""Machines as part of a study: their names, their records, a point's latency key on another
machine, and the front at one machine's latencies."""

from __future__ import annotations

import socket

import optuna
import pytest
from conftest import run_cli
from omegaconf import OmegaConf

from tuner.front.points import points_of
from tuner.keys import LATENCY_KEY_ATTR
from tuner.latency.machine import MACHINE_NAME, default_machine_name
from tuner.store.latency_table import (
    LatencyTable,
    digest_of,
    key_on,
    latency_key,
    record_session,
    register_keys,
)
from tuner.store.machines import machines_in, record_machine
from tuner.store.optuna_compat import study_id_of

DEPLOY = OmegaConf.create({"backend": "eager", "machine": None, "onnx": {"opset": 17}})
MODEL = OmegaConf.create({"family": "hf_encoder", "ffn_width": None, "dropout": 0.1})
A = {"latency.seq_len": 16, "latency.cpu": "CPU A", "latency.machine": "a"}
B = {"latency.seq_len": 16, "latency.cpu": "CPU B", "latency.machine": "b"}


def _structure(width: int) -> list[list]:
    return [["ffn.weight", [width, 4], "torch.float32"]]


def test_a_point_s_key_on_another_machine_is_the_key_that_machine_builds():
    on_a = latency_key(MODEL, _structure(8), "onnxruntime", DEPLOY, A)
    built_on_b = latency_key(MODEL, _structure(8), "onnxruntime", DEPLOY, B)
    assert digest_of(key_on(on_a, B)) == digest_of(built_on_b)
    assert digest_of(key_on(on_a, B)) != digest_of(on_a)
    # The machine's name is the protocol's; `deploy.machine` set on one worker and not on
    # another changes nothing else in the key.
    named = OmegaConf.merge(DEPLOY, {"machine": "b"})
    assert latency_key(MODEL, _structure(8), "onnxruntime", named, B) == built_on_b


def test_two_names_on_one_machine_are_two_machines():
    key = latency_key(MODEL, _structure(8), "eager", DEPLOY, A)
    renamed = {**A, "latency.machine": "a-capped"}
    assert digest_of(key_on(key, renamed)) != digest_of(key)


def test_the_default_name_is_the_host_cpu_and_caps(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    plain = default_machine_name()
    host = socket.gethostname().split(".")[0].lower()
    assert MACHINE_NAME.match(plain) and plain.startswith(host.replace("_", "-")[:20])
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    capped = default_machine_name()
    assert MACHINE_NAME.match(capped) and capped.endswith("-avx2") and capped != plain


@pytest.mark.parametrize(
    "override, key",
    [
        ("deploy.machine='edge box'", "deploy.machine"),
        ("deploy.machine=../etc", "deploy.machine"),
        ("study.target_machine=a/b", "study.target_machine"),
        ("study.target_wait_s=0", "study.target_wait_s"),
    ],
)
def test_a_machine_name_mlflow_or_the_file_system_cannot_hold_is_refused(tmp_path, override, key):
    result = run_cli(tmp_path, "+experiment=bert_ffn", "debug=smoke", override)
    assert result.returncode == 2
    assert f"key '{key}'" in result.stderr
    assert not (tmp_path / "optuna.db").exists()


def _study(tmp_path) -> tuple[optuna.Study, optuna.storages.BaseStorage, int]:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}")
    study = optuna.create_study(storage=storage, study_name="s", directions=["maximize"] * 2)
    return study, storage, study_id_of(study)


def test_a_machine_recorded_again_under_its_name_with_other_versions_says_so(tmp_path):
    _, storage, study_id = _study(tmp_path)
    first, earlier = record_machine(storage, study_id, A)
    assert earlier is None and first.record == A
    _, earlier = record_machine(storage, study_id, A)
    assert earlier is None
    upgraded = {**A, "latency.onnxruntime_version": "9.9"}
    _, earlier = record_machine(storage, study_id, upgraded)
    assert earlier is not None and earlier.record == A
    assert machines_in(storage.get_study_user_attrs(study_id))["a"].record == upgraded


def test_the_front_on_another_machine_ranks_by_that_machine_s_latencies(tmp_path):
    # Three points timed on machine a: X (0.90, 10 ms), Y (0.85, 4 ms), Z (0.80, 6 ms): Y
    # dominates Z, so the front is X and Y. Machine b timed X at 3 ms and Z at 2 ms, and not Y,
    # which is left out there: X is the more accurate and Z the faster, so both are on b's
    # front.
    study, storage, study_id = _study(tmp_path)
    on_b = {"x": 3.0, "z": 2.0}
    for name, accuracy, width, on_a in (
        ("x", 0.90, 8, 10.0),
        ("y", 0.85, 4, 4.0),
        ("z", 0.80, 2, 6.0),
    ):
        key = latency_key(MODEL, _structure(width), "eager", DEPLOY, A)
        record_session(storage, study_id, key, [[on_a] * 3])
        if name in on_b:
            record_session(storage, study_id, key_on(key, B), [[on_b[name]] * 3])
        study.add_trial(
            optuna.trial.create_trial(
                values=[accuracy, on_a],
                user_attrs={"deploy.backend": "eager", LATENCY_KEY_ATTR: digest_of(key)},
            )
        )
    table = LatencyTable.of_attrs(study.user_attrs)
    here = points_of(study.trials, table=table)
    assert [(p.latency_ms, p.pareto) for p in here] == [(10.0, True), (4.0, True), (6.0, False)]
    there = points_of(study.trials, table=table, on=B)
    assert [(p.trial_number, p.latency_ms, p.pareto) for p in there] == [
        (0, 3.0, True),
        (2, 2.0, True),
    ]


def test_keys_registered_before_any_session_are_read_back_unmeasured(tmp_path):
    _, storage, study_id = _study(tmp_path)
    key = latency_key(MODEL, _structure(8), "eager", DEPLOY, A)
    register_keys(storage, study_id, [key])
    table = LatencyTable.of_study(storage, study_id)
    assert table.keys[digest_of(key)] == key
    assert table.round_count(digest_of(key)) == 0 and table.result(digest_of(key)) is None
    assert table.digest_on(digest_of(key), B) == digest_of(key_on(key, B))
