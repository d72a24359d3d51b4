"""Reviewing a study: the front on the parent MLflow run, hypervolume, logged models of the
Pareto points, exact retraining, and `python -m tuner.report` (real smoke studies, subprocesses).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import mlflow
import optuna
import pandas as pd
import pytest
import torch
import warm
from conftest import (
    REPO,
    TWO_BACKENDS,
    machine_runs,
    pooled_sessions,
    run_cli,
    runnable_backends,
    stored_sessions,
)
from mlflow.tracking import MlflowClient
from smoke_study import SMOKE, copy_of_study

from tuner.config.compose import apply_debug, compose_config, resolve
from tuner.data import load_splits
from tuner.front.points import study_points
from tuner.keys import (
    EAGER_ACCURACY_ATTR,
    LATENCY_KEY_ATTR,
    MODEL_ABSENT_TAG,
    MODEL_URI_TAG,
    RETRAIN_TAG,
    ROLE_TAG,
)

# Real studies in subprocesses: the full suite's, not the fast selection's. In the process of a
# parallel run that makes the smoke study they read.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("smoke_study")]

STUDY = "bert_ffn-smoke"


def _stores(path) -> tuple[str, str]:
    return f"sqlite:///{path}/optuna.db", f"sqlite:///{path}/mlflow.db"


def _runs(path):
    client = MlflowClient(_stores(path)[1])
    experiment = client.get_experiment_by_name(STUDY)
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = sorted(
        (r for r in runs if r.data.tags.get(ROLE_TAG) == "study"),
        key=lambda r: r.info.start_time,
    )
    children = [r for r in runs if r.data.tags.get(ROLE_TAG) == "trial"]
    return client, experiment, parents, children


def _load_study(path, name=STUDY) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=_stores(path)[0])


def _script(name: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `scripts/<name>` with `args` as a user would."""
    command = [sys.executable, str(REPO / "scripts" / name), *args]
    return warm.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)


def _report(path, *args: str) -> subprocess.CompletedProcess:
    optuna_url, mlflow_url = _stores(path)
    command = [
        sys.executable,
        "-m",
        "tuner.report",
        *SMOKE,
        f"study.storage={optuna_url}",
        f"tracking.uri={mlflow_url}",
        *args,
    ]
    return warm.run(command, cwd=path, capture_output=True, text=True, timeout=600)


def _dominated_area(points: list[tuple[float, float]], reference: list[float]) -> float:
    """The area (accuracy x ms) the (accuracy, latency) points dominate up to the reference
    (worst accuracy, worst latency): the union of the rectangles each spans to the reference
    corner, by inclusion-exclusion. The rectangles of a set of points meet in the one of their
    least accuracy and greatest latency, so no staircase (`tuner.front.pareto`'s way) is built:
    dominated and duplicate points are added and taken away again by the sum."""
    worst_accuracy, worst_latency = reference
    boxes = [
        (accuracy - worst_accuracy, worst_latency - latency)
        for accuracy, latency in points
        if accuracy > worst_accuracy and latency < worst_latency
    ]
    area = 0.0
    for size in range(1, len(boxes) + 1):
        for chosen in itertools.combinations(boxes, size):
            height, width = min(h for h, _ in chosen), min(w for _, w in chosen)
            area += (-1) ** (size + 1) * height * width
    return area


def test_the_dominated_area_of_hand_made_points():
    # One rectangle: 0.3 x 30; two make a staircase (10 x 0.3 + 20 x 0.4); a point dominated
    # by one of them, and a duplicate, add nothing; one beyond the reference neither.
    reference = [0.5, 40.0]
    assert _dominated_area([(0.8, 10.0)], reference) == pytest.approx(9.0)
    staircase = [(0.8, 10.0), (0.9, 20.0)]
    assert _dominated_area(staircase, reference) == pytest.approx(11.0)
    extra = [(0.85, 25.0), (0.8, 10.0), (0.95, 45.0), (0.4, 1.0)]
    assert _dominated_area(staircase + extra, reference) == pytest.approx(11.0)


@pytest.fixture(scope="module")
def smoke(smoke_study, tmp_path_factory):
    """The finished smoke study, copied for the tests below, which read it and add to it."""
    return copy_of_study(smoke_study, tmp_path_factory.mktemp("study"))


def test_parent_run_holds_the_front_hypervolume_and_protocol(smoke):
    client, _, parents, children = _runs(smoke)
    parent = parents[0]
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "pareto")}
    assert artifacts == {"pareto/front.csv", "pareto/front.png", "pareto/front.html"}
    # The front's points by where their time goes.
    profiles = {a.path for a in client.list_artifacts(parent.info.run_id, "profile")}
    assert profiles == {"profile/by_backend.png", "profile/by_backend.html"}
    page = open(client.download_artifacts(parent.info.run_id, "pareto/front.html", str(smoke)))
    html = page.read()
    assert "Plotly.newPlot" in html and '<script src="http' not in html

    study = _load_study(smoke)
    points = study_points(study)
    history = client.get_metric_history(parent.info.run_id, "hypervolume")
    # One value after each of the 2 trained configurations, stepped by their count (not by the
    # points, one per backend), and one more at the last step where the end of the run timed
    # the front again; without constraints no point drops out, so it cannot fall.
    history = sorted(history, key=lambda m: (m.step, m.timestamp))
    confirmed = "Confirming the front" in (smoke / "stdout.txt").read_text()
    assert [m.step for m in history] == ([1, 2, 2] if confirmed else [1, 2])
    assert history[0].value <= history[1].value
    seconds = client.get_metric_history(parent.info.run_id, "search_seconds")
    seconds = sorted(seconds, key=lambda m: (m.step, m.timestamp))
    assert [m.step for m in seconds] == [m.step for m in history]
    assert 0 < seconds[0].value < seconds[1].value <= seconds[-1].value
    reference = study.user_attrs["hypervolume_reference"]
    # Fixed after the first trial: twice the slowest point of the first trained model, as its
    # points were made (their Optuna values; the table may have grown since).
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    first = [t.values[1] for t in complete if t.user_attrs.get("trained_in_trial") == 0]
    # (the table keeps milliseconds to 4 decimals)
    assert reference == [0.0, pytest.approx(2 * max(first), abs=1e-3)]
    # No constraints: every point is feasible and counts toward the hypervolume.
    assert all(p.feasible for p in points)
    expected = _dominated_area([(p.val_accuracy, p.latency_ms) for p in points], reference)
    assert history[-1].value == pytest.approx(expected)
    front_size = client.get_metric_history(parent.info.run_id, "pareto_points")[-1].value
    assert front_size == sum(p.pareto for p in points)

    note = parent.data.tags["mlflow.note.content"]
    assert "Hypervolume" in note and "Latency protocol: batch_size=1, seq_len=32" in note
    on_front = {p.trial_number for p in points if p.pareto}
    for run in children:
        wanted = "true" if int(run.data.tags["optuna.trial_number"]) in on_front else "false"
        assert run.data.tags["pareto"] == wanted


def test_pareto_points_are_deployable_mlflow_models(smoke, tmp_path):
    client, experiment, _, children = _runs(smoke)
    study = _load_study(smoke)
    points = study_points(study)
    front = [p for p in points if p.pareto]
    assert front
    cfg = resolve(apply_debug(compose_config(SMOKE)))
    splits = load_splits(cfg.data)
    logged = {m.model_id for m in client.search_logged_models([experiment.experiment_id])}
    for point in front:
        run = client.get_run(point.mlflow_run_id)
        if point.model_uri is None:
            # Dominated when it was made (no model logged then); a later session raised the
            # latency of a point that dominated it. Its run says so and how to get its model.
            assert run.data.tags[MODEL_ABSENT_TAG].startswith("joined the front after")
            continue
        assert point.model_uri.removeprefix("models:/") in logged
        assert run.data.tags[MODEL_URI_TAG] == point.model_uri
        mlflow.set_tracking_uri(_stores(smoke)[1])
        model = mlflow.pyfunc.load_model(point.model_uri)
        schema = model.metadata.signature
        assert schema.inputs.input_names() == ["text"]
        assert schema.outputs.input_names() == ["label", "score"]
        assert model.metadata.metadata["deploy.backend"] == point.backend
        assert model.metadata.metadata["retrain"] == run.data.tags[RETRAIN_TAG]
        # What the point ships says how it was deployed: its own backend, not the base config's.
        local = Path(
            mlflow.artifacts.download_artifacts(
                point.model_uri, dst_path=str(tmp_path / str(point.trial_number))
            )
        )
        spec = json.loads(next(local.rglob("point.json")).read_text())
        assert spec["deploy"]["backend"] == point.backend
        # The served model is the measured one: it reproduces the point's validation accuracy.
        predicted = model.predict(pd.DataFrame({"text": splits.val.items}))
        assert set(predicted["label"]) <= set(splits.label_names)
        truth = [splits.label_names[label] for label in splits.val.labels]
        accuracy = float((predicted["label"] == truth).mean())
        assert accuracy == pytest.approx(point.val_accuracy, abs=1e-9)
    # Points that never joined the front carry no model; one on it without a model joined it
    # later, and its run says so.
    for run in children:
        number = int(run.data.tags["optuna.trial_number"])
        backend = run.data.tags["deploy.backend"]
        point = next((p for p in points if (p.trial_number, p.backend) == (number, backend)), None)
        if point is not None and MODEL_URI_TAG not in run.data.tags:
            assert not point.pareto or MODEL_ABSENT_TAG in run.data.tags


def test_retrain_commands_reproduce_two_backends_of_one_model(smoke, tmp_path):
    study = _load_study(smoke)
    model = study_points(study)[0].trained_in_trial
    points = [p for p in study_points(study) if p.trained_in_trial == model][:2]
    assert len({p.backend for p in points}) == 2
    client = MlflowClient(_stores(smoke)[1])
    for point in points:
        command = shlex.split(client.get_run(point.mlflow_run_id).data.tags[RETRAIN_TAG])
        assert command[:3] == ["python", "-m", "tuner"]
        overrides = command[3:]
        assert f"deploy.backend={point.backend}" in overrides
        assert "debug.overrides.study.n_trials=1" in overrides
        # Both run against the same fresh stores, so the original study is untouched: each
        # point retrains into a study of its own, named after the model and the backend.
        overrides = [o for o in overrides if not o.startswith(("study.storage=", "tracking.uri="))]
        result = run_cli(tmp_path, *overrides)
        assert result.returncode == 0, result.stderr
        retrained_name = f"bert_ffn-retrain-{model}-{point.backend}-smoke"
        retrained = _load_study(tmp_path, retrained_name).get_trials(
            states=(optuna.trial.TrialState.COMPLETE,)
        )
        assert len(retrained) == 1
        assert retrained[0].user_attrs["deploy.backend"] == point.backend
        assert retrained[0].values[0] == pytest.approx(point.val_accuracy, abs=1e-9)


def _best_eager_accuracy(study: optuna.Study) -> float:
    """The best eager fp32 validation accuracy of the study's trained models, read straight
    from its complete trials."""
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    return max(t.user_attrs[EAGER_ACCURACY_ATTR] for t in complete)


def _default_pick(study: optuna.Study):
    """The report's default recommendation, worked out here: the fastest point within one
    accuracy point of the best eager fp32 model (the more accurate, then the earlier, of
    equally fast ones). Nothing as fast is more accurate, so it is on the front. Validation
    accuracies are fractions of 128 examples: 1e-9 tells a point at the limit from one a whole
    example beyond it."""
    best = _best_eager_accuracy(study)
    close = [p for p in study_points(study) if p.val_accuracy >= best - 0.01 - 1e-9]
    return min(close, key=lambda p: (p.latency_ms, -p.val_accuracy, p.trial_number))


def test_report_recommends_evaluates_and_exports(smoke, tmp_path):
    study = _load_study(smoke)
    expected = _default_pick(study)
    rule: tuple[str, ...] = ()
    if expected.model_uri is None:
        # It joined the front when the end of the run timed the front again, after models
        # were logged: the report refuses to export it, and names it.
        refused = _report(smoke, "--export", str(tmp_path / "refused"))
        assert refused.returncode == 2
        assert f"trial #{expected.trial_number} has no model" in refused.stderr
        # A latency budget alone picks the most accurate point within it: at the latency of
        # the fastest front point that has its model, that point (the front's faster points
        # are less accurate).
        expected = min(
            (p for p in study_points(study) if p.pareto and p.model_uri is not None),
            key=lambda p: p.latency_ms,
        )
        rule = ("--max-latency-ms", repr(expected.latency_ms))
    export = tmp_path / "export"
    result = _report(smoke, *rule, "--export", str(export))
    assert result.returncode == 0, result.stderr
    assert f"Recommended: trial #{expected.trial_number}" in result.stdout
    assert "Pareto front of 'bert_ffn-smoke'" in result.stdout

    run = MlflowClient(_stores(smoke)[1]).get_run(expected.mlflow_run_id)
    test_accuracy = run.data.metrics["test_accuracy"]
    assert 0.0 <= test_accuracy <= 1.0
    assert f"Test accuracy {test_accuracy:.4f}" in result.stdout
    summary = json.loads((export / "point.json").read_text())
    assert summary["trial"] == expected.trial_number
    assert summary["backend"] == expected.backend
    assert summary["test_accuracy"] == pytest.approx(test_accuracy)
    assert summary["retrain"].startswith("python -m tuner +experiment=bert_ffn debug=smoke")
    assert summary["latency_protocol"]["latency.seq_len"] == "32"
    exported = mlflow.pyfunc.load_model(str(export / "model"))
    assert len(exported.predict(pd.DataFrame({"text": ["a fine film", "dull"]}))) == 2

    # The test split is evaluated once; a second report reuses the recorded value.
    again = _report(smoke, *rule)
    assert "evaluated before" in again.stdout and "Evaluating" not in again.stdout
    # Exporting over a non-empty directory is refused before anything is read or evaluated.
    refused = _report(smoke, *rule, "--export", str(export))
    assert refused.returncode == 2 and "not empty" in refused.stderr
    assert "Pareto front" not in refused.stdout


def test_every_point_records_where_its_time_goes_and_its_roofline(smoke):
    from tuner.deploy.backends import BACKENDS
    from tuner.insight.roofline import stored_peaks

    study = _load_study(smoke)
    client = MlflowClient(_stores(smoke)[1])
    # One machine ran the study: one set of peaks, measured under the protocol's 2 threads.
    (peak,) = stored_peaks(study.user_attrs).values()
    assert peak.threads == 2 and peak.gemm_gflops["fp32"] > 1 and peak.bandwidth_gbs > 0.5
    flops_of_model: dict[int, set[float]] = {}
    # `openvino` computes in bf16 where the CPU has native bf16 that oneDNN may use (its `auto`
    # precision), else fp32; every other backend in the precision it states.
    openvino = "bf16" if machine_runs("bf16") else "fp32"
    for point in study_points(study):
        insight = point.insight
        assert insight is not None and insight.profile_ms, point.backend
        stated = BACKENDS.get(point.backend).precision
        assert insight.precision == (openvino if point.backend == "openvino" else stated)
        flops_of_model.setdefault(point.trained_in_trial, set()).add(insight.flops)
        run = client.get_run(point.mlflow_run_id).data
        metrics = run.metrics
        # `train.device: auto` on a machine without a GPU: trained on the CPU, no GPU memory.
        if not torch.cuda.is_available():
            assert run.tags["train.trained_on"] == "cpu"
            assert "train_gpu_peak_mb" not in metrics
        # What the trial keeps is what its run logged.
        assert sum(insight.profile_ms.values()) == pytest.approx(metrics["profile.total_ms"])
        # Achieved throughput: the FLOPs per call over the latency the point was made with
        # (the first of its history: the end of the run may revise the latency since).
        history = client.get_metric_history(point.mlflow_run_id, "latency_ms_p50")
        seconds = min(history, key=lambda m: (m.step, m.timestamp)).value / 1000
        assert metrics["achieved_gflops"] == pytest.approx(metrics["gflops_per_call"] / seconds)
        assert 0 < metrics["roofline_fraction"] <= 1.5
    # FLOPs are the architecture's: the same on every backend of one trained model, and
    # larger for the unedited teacher (#0) than for the shrunken student.
    assert all(len(found) == 1 for found in flops_of_model.values())
    (teacher,), (student,) = flops_of_model[0], flops_of_model[max(flops_of_model)]
    assert teacher > student > 0


def test_the_report_shows_where_the_time_goes_and_profiles_a_point_on_demand(smoke):
    study = _load_study(smoke)
    points = study_points(study)
    chosen = _default_pick(study)
    result = _report(smoke, "--skip-test", "--profile", str(chosen.trial_number))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Where one call's time goes" in out and f"#{chosen.trial_number} {chosen.backend}" in out
    assert "roofline fraction" in out and "layout ops" in out
    if chosen.backend != "eager":
        assert "Biggest difference: " in out
    # The fresh profile of the logged model, at the protocol's input shape (batch 1, 32 tokens).
    assert f"Profiling trial #{chosen.trial_number} ({chosen.backend})" in out
    assert f"{chosen.backend}, one call on 1x32, 1x32:" in out and "matmul/conv" in out
    # A point without a logged model, or no point at all, is refused before anything runs.
    unlogged = next(p for p in points if p.model_uri is None)
    refused = _report(smoke, "--skip-test", "--profile", str(unlogged.trial_number))
    assert refused.returncode == 2 and "has no logged model" in refused.stderr
    missing = _report(smoke, "--skip-test", "--profile", "999")
    assert missing.returncode == 2 and "no complete point #999" in missing.stderr
    assert "Recommended" not in missing.stdout


def test_front_latencies_rest_on_two_sessions_and_every_run_shows_its_table_latency(smoke):
    study = _load_study(smoke)
    trials = {t.number: t for t in study.trials}
    front = [p for p in study_points(study) if p.pareto]
    keyed = [p for p in front if trials[p.trial_number].user_attrs.get(LATENCY_KEY_ATTR)]
    assert keyed
    # deploy.latency.front_sessions defaults to 2: the end of the run timed each front key again
    # until two of its sessions count (steady rounds), or twice: 1 + 2 sessions at least.
    counts = {}
    for name, session in study.user_attrs.items():
        if name.startswith("latency:"):
            counts.setdefault(name.split(":")[1], []).append(session.get("steady") is not False)
    for point in keyed:
        found = counts[trials[point.trial_number].user_attrs[LATENCY_KEY_ATTR]]
        assert len(found) >= 2 and (sum(found) >= 2 or len(found) >= 3)

    counted = pooled_sessions(study.user_attrs)

    def p50_of(trial):
        rounds = [r for s in counted[trial.user_attrs[LATENCY_KEY_ATTR]] for r in s]
        return statistics.median(statistics.median(r) for r in rounds), len(rounds)

    client, _, parents, children = _runs(smoke)
    revised = 0
    for run in children:
        trial = trials[int(run.data.tags["optuna.trial_number"])]
        if trial.state != optuna.trial.TrialState.COMPLETE:
            continue
        p50, rounds = p50_of(trial)
        # The run shows its key's latency over every session, worked out here from the rounds.
        assert run.data.metrics["latency_ms_p50"] == pytest.approx(p50, abs=1e-3)
        assert run.data.metrics["latency_rounds"] == rounds
        history = client.get_metric_history(run.info.run_id, "latency_ms_p50")
        # Its first value is what the point was made with: its Optuna objective.
        first = min(history, key=lambda m: (m.step, m.timestamp))
        assert first.value == pytest.approx(trial.values[1])
        revised += len(history) > 1
    assert revised >= len(keyed)
    front_csv = client.download_artifacts(parents[-1].info.run_id, "pareto/front.csv", str(smoke))
    table = pd.read_csv(front_csv)
    for point in keyed:
        (row,) = table[table["trial"] == point.trial_number]["latency_ms_p50"]
        assert row == pytest.approx(p50_of(trials[point.trial_number])[0], abs=1e-3)


def _printed(before_ms: float) -> float:
    """How far a move the script prints (to 0.1%) can be from one worked out here from a
    fresh latency it printed (to 0.01 ms, so up to 0.005 ms off) against `before_ms`."""
    return 100 * 0.005 / before_ms + 0.05 + 1e-9


def test_retime_front_times_the_front_again_against_the_study_s_table(smoke):
    result = _script("retime_front.py", "--sessions", "2", "--interval", "1", *SMOKE, cwd=smoke)
    assert result.returncode == 0, result.stderr
    study = _load_study(smoke)
    front = [p for p in study_points(study) if p.pareto]
    rows = [
        [cell.strip() for cell in line.split("|")[1:-1]]
        for line in result.stdout.splitlines()
        if line.startswith("| #")
    ]
    assert [row[0] for row in rows] == [f"#{p.trial_number} {p.backend}" for p in front]
    for row, point in zip(rows, front, strict=True):
        digest = study.trials[point.trial_number].user_attrs[LATENCY_KEY_ATTR]
        counted = pooled_sessions(study.user_attrs)[digest]
        rounds = [r for session in counted for r in session]
        # The table's side, worked out from its rounds: the median of the rounds' medians and
        # the fastest call; each move is the fresh figure's against it.
        p50 = statistics.median(statistics.median(r) for r in rounds)
        fastest = min(min(r) for r in rounds)
        assert row[1].startswith(f"{p50:.2f} ({len(rounds)}, {len(counted)}, ")
        assert row[4] == f"{fastest:.2f}"
        for before, now, moved in ((p50, row[2].split()[0], row[3]), (fastest, row[5], row[6])):
            expected = 100 * (float(now) - before) / before
            assert float(moved.rstrip("%")) == pytest.approx(expected, abs=_printed(before))
        # The first session alone is part of the two: its fastest call is no faster.
        first_fastest = float(row[7].split(",")[1].strip().rstrip("%"))
        assert first_fastest >= float(row[6].rstrip("%")) - 0.05
        # Every stored session, the unsteady ones too: the p50 and the fresh one's move from it.
        every = [r for session in stored_sessions(study.user_attrs)[digest] for r in session]
        every_p50 = statistics.median(statistics.median(r) for r in every)
        shown, every_moved = row[8].split(": ")
        assert shown == f"{every_p50:.2f}"
        expected = 100 * (float(row[2].split()[0]) - every_p50) / every_p50
        assert float(every_moved.rstrip("%")) == pytest.approx(expected, abs=_printed(every_p50))
    summaries = [line for line in result.stdout.splitlines() if line.startswith("By ")]
    assert [line.split(":")[0] for line in summaries] == [
        "By p50",
        "By fastest call",
        "By first session's p50",
        "By first session's fastest call",
        "By p50 against every table session",
    ]
    assert all(f"of {len(front)} within 10%" in line for line in summaries)
    assert "re-timed in 2 session(s) 1 s apart" in result.stdout


def test_the_front_to_time_again_is_the_one_under_the_study_s_own_constraints(smoke, tmp_path):
    import shutil

    from tuner.keys import SETTINGS_ATTR
    from tuner.study.stored_front import study_front

    # The smoke study, as if made with study.max_accuracy_drop=0: points below the best eager
    # fp32 accuracy are infeasible, and the front is that of the others.
    shutil.copy(smoke / "optuna.db", tmp_path / "optuna.db")
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.load_study(study_name=STUDY, storage=url)
    study.set_user_attr(
        SETTINGS_ATTR, {**study.user_attrs[SETTINGS_ATTR], "study.max_accuracy_drop": 0.0}
    )
    points = study_points(study)  # no constraint: the table latency of every point
    best = _best_eager_accuracy(study)
    feasible = [p for p in points if p.val_accuracy >= best]
    expected = {
        f"#{p.trial_number} {p.backend}"
        for p in feasible
        if not any(
            (q.val_accuracy >= p.val_accuracy and q.latency_ms <= p.latency_ms)
            and (q.val_accuracy > p.val_accuracy or q.latency_ms < p.latency_ms)
            for q in feasible
        )
    }
    unconstrained = {f"#{p.trial_number} {p.backend}" for p in points if p.pareto}
    assert expected and expected != unconstrained
    front = study_front([*SMOKE, f"study.storage={url}"])
    assert {target.label for target in front.targets} == expected


def test_bench_steadiness_splits_the_front_s_windows_by_the_machine_reference(smoke):
    result = _script("bench_steadiness.py", "--seconds", "4", "--calls", "3", *SMOKE, cwd=smoke)
    assert result.returncode == 0, result.stderr
    front = [p for p in study_points(_load_study(smoke)) if p.pareto]
    (summary,) = [line for line in result.stdout.splitlines() if " windows in 4 s;" in line]
    windows = int(summary.split()[0])
    steady = int(summary.split("; ")[-1].split()[0])
    assert windows >= 1 and 0 <= steady <= windows
    rows = [
        [cell.strip() for cell in line.split("|")[1:-1]]
        for line in result.stdout.splitlines()
        if line.startswith("| #")
    ]
    assert [row[0] for row in rows] == [f"#{p.trial_number} {p.backend}" for p in front]
    for row in rows:
        assert float(row[1]) > 0
        # The windows near the fastest, among all, are those among steady and other windows.
        counts = {"-": (0.0, 0)}
        shares = [counts.get(c) or (float(c.split("%")[0]), int(c.split()[-1])) for c in row[3:5]]
        assert shares[0][1] == steady and shares[0][1] + shares[1][1] == windows
        pooled = sum(share * n for share, n in shares) / windows
        assert float(row[2].rstrip("%")) == pytest.approx(pooled, abs=1.0)
        assert -1 <= float(row[5]) <= 1 or row[5] == "nan"


def test_bench_backends_compares_the_study_s_fastest_close_point_by_its_statistic(smoke):
    result = _script(
        "bench_backends.py",
        *("--ffn-width", "512", "--backends", "eager", "--seq-len", "32"),
        *("--train-samples", "64", "--val-samples", "32", "--rounds", "1", "--repeats", "2"),
        *("--study", STUDY, "--storage", _stores(smoke)[0], "--max-accuracy-drop", "1.0"),
    )
    assert result.returncode == 0, result.stderr
    (line,) = [row for row in result.stdout.splitlines() if row.startswith(f"Study {STUDY}:")]
    # The fastest point within a whole accuracy unit of the best eager model: any point.
    study = _load_study(smoke)
    fastest = min(study_points(study), key=lambda p: p.latency_ms)
    assert f"trial {fastest.trial_number} ({fastest.backend}" in line
    found = re.search(r" p50 ([\d.]+) ms = ([\d.]+)x faster than .* \(([\d.]+) ms here\)", line)
    point_ms, speedup, baseline_ms = (float(value) for value in found.groups())
    assert point_ms == pytest.approx(fastest.latency_ms, abs=0.005)
    # Both latencies and the speed-up are printed to 2 decimals, the speed-up from the
    # unrounded latencies: it lies within what the printed latencies allow, give or take its
    # own rounding (a relative bound fails on a point of half a millisecond).
    least = (baseline_ms - 0.005) / (point_ms + 0.005)
    most = (baseline_ms + 0.005) / (point_ms - 0.005)
    assert least - 0.005 <= speedup <= most + 0.005


def test_report_rules_and_a_study_still_running(smoke):
    study = _load_study(smoke)
    points = study_points(study)
    # A latency budget alone picks the most accurate front point within it. The fastest point
    # (the more accurate of equally fast ones) is on the front, and a budget of its latency
    # admits no other front point: it is picked.
    fastest = min(points, key=lambda p: (p.latency_ms, -p.val_accuracy, p.trial_number))
    budget = _report(smoke, "--skip-test", "--max-latency-ms", repr(fastest.latency_ms))
    assert budget.returncode == 0, budget.stderr
    assert f"Recommended: trial #{fastest.trial_number} " in budget.stdout
    # The most accurate point (the faster of equally accurate ones) is on the front too, and
    # no front point is slower: a budget of its latency admits the whole front, and it is the
    # most accurate there.
    best = min(points, key=lambda p: (-p.val_accuracy, p.latency_ms, p.trial_number))
    roomy = _report(smoke, "--skip-test", "--max-latency-ms", repr(best.latency_ms))
    assert roomy.returncode == 0, roomy.stderr
    assert f"Recommended: trial #{best.trial_number} " in roomy.stdout
    nothing = _report(smoke, "--skip-test", "--max-latency-ms", "0.000001")
    assert nothing.returncode == 1 and "No point of the front" in nothing.stdout

    running = study.ask()  # what a worker in the middle of a trial leaves in the storage
    try:
        during = _report(smoke, "--skip-test")
        assert during.returncode == 0, during.stderr
        assert "1 trial(s) still running" in during.stdout
    finally:
        study.tell(running, state=optuna.trial.TrialState.FAIL)


def test_the_report_reads_the_study_s_own_data_and_constraints(smoke, tmp_path):
    # Another data source or split on the report's command line would put other examples
    # (even training ones) into the "test" accuracy of the study's point: refused, by key.
    other = tmp_path / "reviews.csv"
    other.write_text("text,label\n" + "".join(f"review {i},{i % 2}\n" for i in range(60)))
    for typed in (("data.split_seed=5",), ("data=csv", f"data.path={other}")):
        result = _report(smoke, *typed)
        assert result.returncode == 2, result.stdout
        assert "study 'bert_ffn-smoke' was created with data." in result.stderr
        assert "Evaluating" not in result.stdout
    seed = _report(smoke, "--skip-test", "data.split_seed=5")
    assert "created with data.split_seed=0, this command gives data.split_seed=5" in seed.stderr
    # Unless the key is one this command may set on purpose.
    moved = _report(smoke, "--skip-test", "data.split_seed=5", "study.change_settings=[data]")
    assert moved.returncode == 0, moved.stderr
    constraint = _report(smoke, "--skip-test", "study.max_accuracy_drop=0.001")
    assert constraint.returncode == 2 and "key 'study.max_accuracy_drop'" in constraint.stderr
    # Said once per report: what the drops are measured from.
    plain = _report(smoke, "--skip-test")
    assert "against the best eager fp32 validation accuracy" in plain.stdout


def test_report_names_a_missing_study(smoke):
    result = _report(smoke, "study.name=nope")
    assert result.returncode == 2
    assert "key 'study.name': no study 'nope-smoke'" in result.stderr
    assert STUDY in result.stderr


def test_storage_stays_readable_by_standard_optuna_tools(smoke):
    study = _load_study(smoke)
    frame = study.trials_dataframe()
    assert len(frame) == len(study.trials)
    assert {"values_val_accuracy", "values_latency_ms_p50"} <= set(frame.columns)
    figure = optuna.visualization.plot_pareto_front(study)
    assert figure.data
    assert [t.number for t in study.best_trials]


def test_tags_stay_right_after_a_resume_that_changes_the_front(tmp_path):
    light = (*SMOKE, TWO_BACKENDS)
    first = run_cli(tmp_path, *light, "debug.overrides.study.n_trials=1")
    assert first.returncode == 0, first.stderr
    _, _, _, children = _runs(tmp_path)
    assert any(r.data.tags["pareto"] == "true" for r in children)
    study = _load_study(tmp_path)
    reference = study.user_attrs["hypervolume_reference"]
    # Another worker's point that dominates everything so far, as a shared storage would show.
    best = max(t.values[0] for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)))
    study.add_trial(
        optuna.trial.create_trial(
            values=[min(best + 0.1, 1.0), 1e-6],
            user_attrs={"deploy.backend": "eager", "reference_accuracy": min(best + 0.1, 1.0)},
        )
    )
    # n_trials is the study's total: the first configuration, the other worker's, one more.
    again = run_cli(tmp_path, *light, "debug.overrides.study.n_trials=3")
    assert again.returncode == 0, again.stderr
    client, _, parents, children = _runs(tmp_path)
    points = {p.trial_number: p for p in study_points(_load_study(tmp_path))}
    # Two configurations trained here, one point per backend this machine runs.
    assert len(children) == 2 * len(runnable_backends(*light))
    for run in children:
        wanted = points[int(run.data.tags["optuna.trial_number"])].pareto
        assert run.data.tags["pareto"] == ("true" if wanted else "false")
    # The first invocation's front points are dominated now: their tags flipped.
    assert all(r.data.tags["pareto"] == "false" for r in children)
    # The hypervolume reference is the study's, kept across invocations; the curve goes on.
    assert _load_study(tmp_path).user_attrs["hypervolume_reference"] == reference
    first_curve = client.get_metric_history(parents[0].info.run_id, "hypervolume")
    second_curve = client.get_metric_history(parents[1].info.run_id, "hypervolume")
    assert second_curve[-1].step > first_curve[-1].step
    assert second_curve[-1].value >= first_curve[-1].value
    assert math.isfinite(second_curve[-1].value)


def test_report_module_runs_from_the_repository_root():
    result = subprocess.run(
        [sys.executable, "-m", "tuner.report", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0
    assert "--max-latency-ms" in result.stdout and "--export" in result.stdout
