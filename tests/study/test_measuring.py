"""Latencies measured where the model will serve: measuring workers (`python -m tuner.measure`)
and a front per machine, on real PostgreSQL with real `python -m tuner` processes. Two machine
names on this one box stand for two machines, one of them with oneDNN held to AVX2."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import warm
from mlflow.tracking import MlflowClient

from tuner.keys import (
    EAGER_ACCURACY_ATTR,
    FAIL_REASON_ATTR,
    LATENCY_KEY_ATTR,
    MODEL_URI_ATTR,
    ROLE_TAG,
)
from tuner.store.latency_table import LatencyTable, digest_of, key_on
from tuner.store.machines import machines_in
from tuner.study import measuring_worker
from tuner.study.confirmation import Rebuilder

pytestmark = pytest.mark.slow

TrialState = optuna.trial.TrialState
# One session per key, every round counted, so that a latency is the median of its rounds'
# medians, worked out here by hand.
SMOKE = (
    "+experiment=bert_ffn",
    "debug=smoke",
    "deploy.backends=[eager,onnxruntime_int8]",
    "deploy.latency.front_sessions=1",
    "deploy.latency.steady_within=null",
)
STUDY = "bert_ffn-smoke"
# Rounds of a first measurement at debug=smoke (deploy.latency.rounds).
ROUNDS = 5
AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2"}


def _stores(postgres_database) -> tuple[str, str]:
    storage, tracking = postgres_database("optuna"), postgres_database("mlflow")
    MlflowClient(tracking).search_experiments()
    return storage, tracking


def _command(module: str, cwd: Path, storage: str, tracking: str, *args: str) -> list[str]:
    hydra = [f"hydra.run.dir={cwd}/outputs"] if module == "tuner" else []
    return [
        sys.executable,
        "-m",
        module,
        *SMOKE,
        f"study.storage={storage}",
        f"tracking.uri={tracking}",
        *hydra,
        *args,
    ]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0", **(extra or {})}


def _run(module: str, cwd: Path, stores: tuple[str, str], *args: str, env=None):
    return warm.run(
        _command(module, cwd, *stores, *args),
        cwd=cwd,
        env=_env(env),
        capture_output=True,
        text=True,
        timeout=900,
    )


def _start(module: str, cwd: Path, stores: tuple[str, str], *args: str, env=None):
    return warm.Popen(
        _command(module, cwd, *stores, *args),
        cwd=cwd,
        env=_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _points(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def _latencies_on(study: optuna.Study, machine: str) -> dict[int, float | None]:
    """Trial -> its p50 on `machine`, read from the stored sessions by hand: the point's key
    with the machine's protocol record, and the median of its rounds' medians."""
    table = LatencyTable.of_attrs(study.user_attrs)
    record = machines_in(study.user_attrs)[machine].record
    found = {}
    for trial in _points(study):
        key = table.keys[trial.user_attrs[LATENCY_KEY_ATTR]]
        sessions = table.sessions.get(digest_of(key_on(key, record)), [])
        medians = sorted(_median(r) for s in sessions for r in s.rounds)
        found[trial.number] = _median(medians) if medians else None
    return found


def _median(values: list[float]) -> float:
    ordered, middle = sorted(values), len(values) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _front(points: dict[int, tuple[float, float]]) -> set[int]:
    """Trials no other point beats on both accuracy and latency (and is not worse on either)."""
    return {
        number
        for number, (accuracy, latency) in points.items()
        if not any(
            a >= accuracy and lat <= latency and (a > accuracy or lat < latency)
            for other, (a, lat) in points.items()
            if other != number
        )
    }


def _sessions_are_whole(study: optuna.Study, machine: str) -> None:
    """Every session `machine`'s measuring workers wrote holds a first measurement's rounds.
    (A training worker's later trial of an architecture it met adds a session of one round.)"""
    table = LatencyTable.of_attrs(study.user_attrs)
    record = machines_in(study.user_attrs)[machine].record
    for trial in _points(study):
        digest = digest_of(key_on(table.keys[trial.user_attrs[LATENCY_KEY_ATTR]], record))
        for session in table.sessions.get(digest, []):
            assert len(session.rounds) == ROUNDS and all(session.rounds), (machine, digest)


def test_a_measuring_worker_fills_its_machine_s_table_and_the_report_recommends_from_it(
    tmp_path, postgres_database
):
    stores = _stores(postgres_database)
    trained = _run("tuner", tmp_path, stores)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    measured = _run("tuner.measure", tmp_path, stores, "deploy.machine=avx2", env=AVX2)
    assert measured.returncode == 0, measured.stdout + measured.stderr
    study = optuna.load_study(study_name=STUDY, storage=stores[0])
    machines = machines_in(study.user_attrs)
    assert machines["avx2"].record["latency.kernel_caps"] == AVX2
    trainer = next(name for name in machines if name != "avx2")
    on_avx2 = _latencies_on(study, "avx2")
    assert None not in on_avx2.values() and len(on_avx2) == 4
    _sessions_are_whole(study, "avx2")

    # The front on avx2, worked out here from its latencies, is the one published and tagged.
    accuracy = {t.number: t.values[0] for t in _points(study)}
    front = _front({n: (accuracy[n], on_avx2[n]) for n in on_avx2})
    client = MlflowClient(stores[1])
    experiment = client.get_experiment_by_name(STUDY)
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parent = next(r for r in runs if r.data.tags.get(ROLE_TAG) == "study")
    path = client.download_artifacts(parent.info.run_id, "pareto/avx2/front.csv", str(tmp_path))
    published = {int(line.split(",")[0]) for line in Path(path).read_text().splitlines()[1:]}
    assert published == front
    tagged = {
        int(r.data.tags["optuna.trial_number"])
        for r in runs
        if r.data.tags.get("pareto.avx2") == "true"
    }
    assert tagged == front
    assert "hypervolume.avx2" in client.get_run(parent.info.run_id).data.metrics

    # The report's default rule: the fastest point within 1 accuracy point of the best eager
    # fp32 model, at avx2's latencies.
    baseline = max(t.user_attrs[EAGER_ACCURACY_ATTR] for t in _points(study))
    within = [n for n in on_avx2 if accuracy[n] >= baseline - 0.01 - 1e-9]
    expected = min(within, key=lambda n: on_avx2[n])
    exported = tmp_path / "exported"
    report = _run(
        "tuner.report",
        tmp_path,
        stores,
        "--machine",
        "avx2",
        "--skip-test",
        "--export",
        str(exported),
    )
    assert re.search(rf"Recommended: trial #{expected} ", report.stdout), report.stdout
    # Its profile is the training worker's (a measuring worker times, it does not profile).
    assert "Where one call's time goes" in report.stdout
    assert "Latencies are avx2's; the profiles" in report.stdout
    if MODEL_URI_ATTR in study.trials[expected].user_attrs:
        assert report.returncode == 0, report.stdout + report.stderr
        # The exported point says where its latency was measured: on avx2, under its record.
        summary = json.loads((exported / "point.json").read_text())
        assert summary["trial"] == expected and summary["machine"] == "avx2"
        assert summary["latency_ms_p50"] == pytest.approx(on_avx2[expected], rel=1e-9)
        assert summary["latency_protocol"]["latency.machine"] == "avx2"
        assert summary["latency_protocol"]["latency.kernel_caps"] == AVX2
    else:  # it never joined the training machine's front, so no model was logged for it
        assert report.returncode == 2 and f"trial #{expected} has no model" in report.stderr
    listed = _run("tuner.report", tmp_path, stores, "--machines")
    assert "avx2: 4 of 4 points measured" in listed.stdout
    assert f"{trainer}: 4 of 4 points measured" in listed.stdout
    unknown = _run("tuner.report", tmp_path, stores, "--machine", "nope")
    assert unknown.returncode == 2
    assert "nope" in unknown.stderr and "avx2" in unknown.stderr and trainer in unknown.stderr

    # Run again, it finds nothing to do.
    again = _run("tuner.measure", tmp_path, stores, "deploy.machine=avx2", env=AVX2)
    assert again.returncode == 0 and "Timed 0 latencies on avx2" in again.stdout

    _rechecks_its_front_against_the_recorded_predictions(tmp_path, stores, trainer)
    _times_its_front_again_from_the_artifacts_it_kept(stores)

    # A worker killed mid-measurement leaves only whole sessions, and the next one measures
    # what it left.
    worker = _start("tuner.measure", tmp_path, stores, "deploy.machine=killed")
    assert worker.stdout is not None
    for line in worker.stdout:
        if " ms (" in line:  # the first key timed: the worker is on its way through the rest
            break
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=60)
    study = optuna.load_study(study_name=STUDY, storage=stores[0])
    _sessions_are_whole(study, "killed")
    left = _latencies_on(study, "killed")
    assert 0 < sum(v is not None for v in left.values()) < len(left)
    # Two workers for one machine at once: every key measured, no session broken.
    both = [_start("tuner.measure", tmp_path, stores, "deploy.machine=killed") for _ in range(2)]
    for process in both:
        output = process.communicate(timeout=600)[0]
        assert process.returncode == 0, output
    study = optuna.load_study(study_name=STUDY, storage=stores[0])
    _sessions_are_whole(study, "killed")
    assert None not in _latencies_on(study, "killed").values()


def test_a_study_aimed_at_a_machine_ranks_by_its_measuring_worker_s_latencies(
    tmp_path, postgres_database
):
    stores = _stores(postgres_database)
    target = ("study.target_machine=edge", "study.target_wait_s=300")
    trainer = _start("tuner", tmp_path, stores, *target)
    assert trainer.stdout is not None
    lines = []
    for line in trainer.stdout:
        lines.append(line)
        if line.startswith("Machine:"):  # the study exists
            break
    measurer = _start(
        "tuner.measure", tmp_path, stores, "deploy.machine=edge", "--follow", "--poll-s", "1"
    )
    output = "".join(lines) + trainer.communicate(timeout=900)[0]
    assert trainer.returncode == 0, output
    measured = measurer.communicate(timeout=300)[0]
    assert measurer.returncode == 0, measured
    study = optuna.load_study(study_name=STUDY, storage=stores[0])
    table = LatencyTable.of_attrs(study.user_attrs)
    points = _points(study)
    assert len(points) == 4
    on_edge = _latencies_on(study, "edge")
    for point in points:
        key = table.keys[point.user_attrs[LATENCY_KEY_ATTR]]
        assert key["protocol"]["latency.machine"] == "edge"
        assert point.values[1] == pytest.approx(on_edge[point.number], rel=1e-3)
    # The training worker timed nothing itself: every session is the measuring worker's.
    timed_on = {table.keys[d]["protocol"]["latency.machine"] for d in table.sessions}
    assert timed_on == {"edge"}


def test_a_target_no_measuring_worker_serves_stops_the_study_after_its_wait(
    tmp_path, postgres_database
):
    storage, tracking = _stores(postgres_database)
    # A password in the storage URL (the local server trusts local connections, so any will
    # do) must not reach the message, which repeats the command line.
    stores = (storage.replace("://postgres@", "://postgres:s3cret@"), tracking)
    started = time.monotonic()
    result = _run("tuner", tmp_path, stores, "study.target_machine=edge", "study.target_wait_s=3")
    assert result.returncode == 1
    assert "no measuring worker for machine 'edge' (study.target_machine) is running" in (
        result.stderr
    )
    assert "python -m tuner.measure +experiment=bert_ffn debug=smoke" in result.stderr
    assert "study.storage=postgresql+psycopg://postgres:***@" in result.stderr
    assert "s3cret" not in result.stderr + result.stdout
    assert "deploy.machine=edge --follow" in result.stderr
    assert time.monotonic() - started < 300
    study = optuna.load_study(study_name=STUDY, storage=storage)
    assert not _points(study)
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert (
        failed
        and "no measuring worker for machine 'edge'" in failed[0].user_attrs[FAIL_REASON_ATTR]
    )


def _rechecks_its_front_against_the_recorded_predictions(
    tmp_path: Path, stores: tuple[str, str], machine: str
) -> None:
    """On the machine that deployed them, the front's logged models repeat every prediction
    they recorded; a point whose record says otherwise on 13 of its 128 validation examples
    agrees on 115/128 and is marked, and the report says so."""
    rechecked = _run("tuner.measure", tmp_path, stores, f"deploy.machine={machine}")
    assert rechecked.returncode == 0, rechecked.stdout + rechecked.stderr
    client = MlflowClient(stores[1])
    experiment = client.get_experiment_by_name(STUDY)
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    checked = [r for r in runs if f"agreement.{machine}" in r.data.metrics]
    assert checked, rechecked.stdout
    for run in checked:
        assert run.data.metrics[f"agreement.{machine}"] == 1.0
        assert run.data.tags[f"tuner.disagrees.{machine}"] == "false"
    tampered = checked[0]
    path = client.download_artifacts(
        tampered.info.run_id, "deploy/val_predictions.json", str(tmp_path / "predictions")
    )
    labels = json.loads(Path(path).read_text())["labels"]
    assert len(labels) == 128
    names = sorted(set(labels)) + ["another label"]
    flipped = [
        names[(names.index(label) + 1) % 2] if i < 13 else label for i, label in enumerate(labels)
    ]
    client.log_dict(tampered.info.run_id, {"labels": flipped}, "deploy/val_predictions.json")
    again = _run("tuner.measure", tmp_path, stores, f"deploy.machine={machine}")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"marked tuner.disagrees.{machine}=true" in again.stdout
    run = client.get_run(tampered.info.run_id)
    assert run.data.metrics[f"agreement.{machine}"] == pytest.approx(115 / 128)
    assert run.data.tags[f"tuner.disagrees.{machine}"] == "true"


@dataclasses.dataclass(frozen=True)
class CountingRebuilder(Rebuilder):
    """The real rebuilder, listing the targets it rebuilds."""

    rebuilt: list[str] = dataclasses.field(default_factory=list)

    def rebuild(self, targets, workdir):
        self.rebuilt.extend(target.label for target in targets)
        return super().rebuild(targets, workdir)


def _times_its_front_again_from_the_artifacts_it_kept(stores: tuple[str, str]) -> None:
    """A measuring worker (in this process) asked for two sessions per front latency gives the
    front's keys their second session from the artifacts it converted for the first: fewer
    rebuilds than sessions (every session came from a rebuild of its own before)."""
    worker = measuring_worker(
        [*SMOKE, f"study.storage={stores[0]}", f"tracking.uri={stores[1]}", "deploy.machine=twice"]
    )
    measurer = worker.measurer
    fields = {f.name: getattr(measurer.rebuilder, f.name) for f in dataclasses.fields(Rebuilder)}
    counting = CountingRebuilder(**fields)
    twice = dataclasses.replace(
        measurer,
        rebuilder=counting,
        protocol=dataclasses.replace(measurer.protocol, front_sessions=2),
    )
    twice.run(follow=False, study_over=lambda: True, poll_s=1)
    study = optuna.load_study(study_name=STUDY, storage=stores[0])
    table = LatencyTable.of_attrs(study.user_attrs)
    record = machines_in(study.user_attrs)["twice"].record
    sessions = {
        trial.number: len(
            table.sessions.get(
                digest_of(key_on(table.keys[trial.user_attrs[LATENCY_KEY_ATTR]], record)), []
            )
        )
        for trial in _points(study)
    }
    accuracy = {t.number: t.values[0] for t in _points(study)}
    on_twice = _latencies_on(study, "twice")
    front = _front({n: (accuracy[n], on_twice[n]) for n in sessions})
    assert all(sessions[n] == 2 for n in front), (sessions, front)
    assert all(sessions[n] >= 1 for n in sessions)
    assert len(counting.rebuilt) < sum(sessions.values()), (counting.rebuilt, sessions)
