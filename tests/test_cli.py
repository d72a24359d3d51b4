"""The real CLI in a subprocess, with the Optuna and MLflow stores in tmp_path."""

from __future__ import annotations

import re
import statistics
import sys
import textwrap

import optuna
import pytest
import warm
from conftest import (
    TWO_BACKENDS,
    pooled_sessions,
    run_cli,
    runnable_backends,
    stored_sessions,
)
from mlflow.tracking import MlflowClient
from smoke_study import SMOKE, copy_of_study

from tuner.deploy.backends import BACKENDS as REGISTERED
from tuner.front.points import study_points
from tuner.keys import (
    ARCHITECTURE_ATTR,
    LATENCY_KEY_ATTR,
    ROLE_TAG,
    TEACHER_OF_ATTR,
    TRAINED_IN_TAG,
)

TrialState = optuna.trial.TrialState
TRAINING_PARAMS = {
    "train.lr",
    "train.weight_decay",
    "train.grad_clip_norm",
    "train.init",
    "train.mixup_alpha",
    "train.distill.alpha",
    "model.ffn_width_fraction",
    "model.num_layers_fraction",
}
# The study's distillation teacher trains first, with bert_ffn's own values of the searched keys
# (conf/experiment/bert_ffn.yaml over conf/train/default.yaml) and no edits; its points carry
# those values as params.
TEACHER_VALUES = {
    "train.lr": 2e-04,
    "train.weight_decay": 1e-05,
    "train.grad_clip_norm": 0,
    "train.init": "auto",
    "train.mixup_alpha": 0,
    "train.distill.alpha": 0,
}
# What this machine deploys every trained model on: bert_ffn's list less what it cannot run.
BACKENDS = set(runnable_backends(*SMOKE))
METRICS = ("val_accuracy", "latency_ms_p50", "latency_ms_p95", "model_size_mb")


def _study(tmp_path, name="bert_ffn-smoke") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/optuna.db")


def _first(client: MlflowClient, run, metric: str) -> float:
    """The first value a run logged of `metric`."""
    history = client.get_metric_history(run.info.run_id, metric)
    return min(history, key=lambda m: (m.step, m.timestamp)).value


def _mlflow(tmp_path, name="bert_ffn-smoke"):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get(ROLE_TAG) == "study"]
    children = [r for r in runs if r.data.tags.get(ROLE_TAG) == "trial"]
    return client, parents, children


def _assert_pareto_tags_match_the_study(tmp_path, children):
    # The front worked out here: each point at its key's latency over the sessions of the
    # study's table that count (the median of the rounds' medians, read straight from the
    # study's attributes), dominance checked pair by pair.
    study = _study(tmp_path)
    rounds = {
        digest: [r for session in sessions for r in session]
        for digest, sessions in pooled_sessions(study.user_attrs).items()
    }
    points = {}
    for trial in study.get_trials(states=(TrialState.COMPLETE,)):
        key = trial.user_attrs.get(LATENCY_KEY_ATTR)
        latency = (
            statistics.median(statistics.median(r) for r in rounds[key]) if key else trial.values[1]
        )
        points[trial.number] = (trial.values[0], latency)
    best = {
        number
        for number, (accuracy, latency) in points.items()
        if not any(
            other_accuracy >= accuracy
            and other_latency <= latency
            and (other_accuracy, other_latency) != (accuracy, latency)
            for other_accuracy, other_latency in points.values()
        )
    }
    assert best
    for run in children:
        on_front = int(run.data.tags["optuna.trial_number"]) in best
        assert run.data.tags["pareto"] == ("true" if on_front else "false")


def _assert_one_training_per_config(study: optuna.Study, trainings: int) -> None:
    """Each trained model gives one point per backend, all with that model's training params."""
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    groups: dict[int, list] = {}
    for trial in complete:
        groups.setdefault(trial.user_attrs["trained_in_trial"], []).append(trial)
    assert len(groups) == trainings
    for trained_in, points in groups.items():
        assert {t.params["deploy.backend"] for t in points} == BACKENDS
        assert len(points) == len(BACKENDS)
        if TEACHER_OF_ATTR in study.trials[trained_in].user_attrs:
            training = TEACHER_VALUES
        else:
            training = {
                k: v for k, v in study.trials[trained_in].params.items() if k in TRAINING_PARAMS
            }
        for point in points:
            assert {k: point.params[k] for k in TRAINING_PARAMS if k in point.params} == training
            assert (
                point.user_attrs["reference_accuracy"] == points[0].user_attrs["reference_accuracy"]
            )


def _assert_each_trial_carries_its_model_s_largest_area(study: optuna.Study) -> None:
    """What the sampler learns from: the point of the model whose rectangle up to the study's
    hypervolume reference is largest (no constraints here, so every point counts)."""
    worst_accuracy, worst_latency = study.user_attrs["hypervolume_reference"]
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    for trial in complete:
        if trial.user_attrs["trained_in_trial"] != trial.number:
            continue
        points = [t for t in complete if t.user_attrs["trained_in_trial"] == trial.number]
        areas = {
            t.params["deploy.backend"]: max(t.values[0] - worst_accuracy, 0.0)
            * max(worst_latency - t.values[1], 0.0)
            for t in points
        }
        assert areas[trial.params["deploy.backend"]] == max(areas.values())


@pytest.mark.slow
@pytest.mark.xdist_group("smoke_study")
def test_smoke_study_end_to_end_and_resume(smoke_study, tmp_path):
    # The first run is the process's smoke study (`run_cli(smoke_study, *SMOKE)`), its records
    # copied here to be resumed.
    stdout = (smoke_study / "stdout.txt").read_text()
    stderr = (smoke_study / "stderr.txt").read_text()
    copy_of_study(smoke_study, tmp_path)
    assert "Trial 1/2" in stdout and "Trial 2/2" in stdout
    assert "Pareto front of 'bert_ffn-smoke'" in stdout
    # Trained once per configuration: a log (no terminal) gets plain progress lines as training
    # goes, each with step, loss and ETA, and the last one at the final step of each trial.
    steps = re.findall(r"^  training step (\d+)/(\d+) \(\d+%\), loss [\d.]+, elapsed", stdout, re.M)
    assert len(steps) > 2 and sum(done == total for done, total in steps) == 2
    # How to review it: the MLflow UI command and the runs view of the study's experiment.
    assert f"mlflow ui --backend-store-uri sqlite:///{smoke_study}/mlflow.db" in stdout
    assert re.search(r"http://127\.0\.0\.1:5000/#/experiments/\d+/runs/[0-9a-f]{32}", stdout)
    # Library spam stays quiet.
    assert "Loading weights" not in stdout + stderr
    assert "Warning" not in stderr

    study = _study(tmp_path)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 2 * len(BACKENDS)
    assert all(len(t.values) == 2 for t in complete)
    teacher = [t for t in complete if TEACHER_OF_ATTR in t.user_attrs]
    assert len(teacher) == len(BACKENDS)
    assert all(t.user_attrs["trained_in_trial"] == 0 for t in teacher)
    students = [t for t in complete if t not in teacher]
    assert all(set(t.params) == TRAINING_PARAMS | {"deploy.backend"} for t in students)
    assert study.metric_names == ["val_accuracy", "latency_ms_p50"]
    _assert_one_training_per_config(study, trainings=2)
    _assert_each_trial_carries_its_model_s_largest_area(study)

    client, parents, children = _mlflow(tmp_path)
    assert len(parents) == 1 and len(children) == len(complete)
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "pareto")}
    assert artifacts == {"pareto/front.csv", "pareto/front.png", "pareto/front.html"}
    front_csv = client.download_artifacts(parent.info.run_id, "pareto/front.csv", str(tmp_path))
    header = open(front_csv).readline().strip().split(",")
    assert header[:7] == ["trial", "backend", *METRICS, "trained_in_trial"]
    assert parent.data.params["latency.seq_len"] == "32"
    assert parent.data.params["latency.torch_version"].startswith("2.")
    by_number = {t.number: t for t in complete}
    for run in children:
        assert run.info.status == "FINISHED"
        tags = run.data.tags
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert tags["optuna.study"] == "bert_ffn-smoke"
        assert tags["pareto"] in ("true", "false")
        trial = by_number[int(tags["optuna.trial_number"])]
        # Optuna and MLflow agree on every point.
        assert tags["deploy.backend"] == trial.params["deploy.backend"]
        assert tags[TRAINED_IN_TAG] == str(trial.user_attrs["trained_in_trial"])
        assert TRAINING_PARAMS | {"deploy.backend"} <= set(run.data.params)
        for protocol_key in ("batch_size", "seq_len", "num_threads", "repeats", "cpu"):
            assert f"latency.{protocol_key}" in run.data.params
        for metric in (*METRICS, "agreement_with_eager", "max_logit_diff", "convert_seconds"):
            assert metric in run.data.metrics
        assert run.data.metrics["val_accuracy"] == pytest.approx(trial.values[0])
        # Optuna keeps the latency the point was made with: the first of the run's history
        # (the end of the run brings the run's latest to the study's latency table).
        assert _first(client, run, "latency_ms_p50") == pytest.approx(trial.values[1])
        # What ships, as a graph, where the artifact is one; elsewhere why there is none.
        if REGISTERED.get(tags["deploy.backend"]).graph is not None:
            assert run.data.metrics["layout_ops"] > 0
            graph = {a.path for a in client.list_artifacts(run.info.run_id, "graph")}
            assert graph == {"graph/ops.json", "graph/graph.txt"}
        else:
            assert "PyTorch artifact" in tags["graph.absent"]
        # Every point: one call's time by operator, from its backend's own profiler.
        assert run.data.metrics["profile.total_ms"] > 0
        profiled = {a.path for a in client.list_artifacts(run.info.run_id, "profile")}
        assert profiled == {"profile/ops.csv"}
        if TEACHER_OF_ATTR in trial.user_attrs:
            # The unedited model: the smoke encoder's 6 layers at MiniLM's FFN width, 2 heads.
            unedited = {"model.ffn_width": 1536, "model.num_layers": 6, "model.num_heads": 2}
            assert trial.user_attrs[ARCHITECTURE_ATTR] == unedited
            assert run.data.params["model.ffn_width_fraction"] == "None"
            assert run.data.params["model.ffn_width"] == "1536"
            assert run.data.params["model.num_layers"] == "6"
            continue
        # Relative edits are recorded with what they stand for on MiniLM (FFN 1536, 6 layers),
        # rounded to a multiple of 64 and half up.
        fraction = trial.params["model.ffn_width_fraction"]
        width = {0.333: 512, 0.5: 768, 0.667: 1024, 0.833: 1280, 1.0: 1536}[fraction]
        assert run.data.params["model.ffn_width_fraction"] == str(fraction)
        assert run.data.params["model.ffn_width"] == str(width)
        layers = {0.5: 3, 0.667: 4, 0.833: 5, 1.0: 6}[trial.params["model.num_layers_fraction"]]
        assert run.data.params["model.num_layers"] == str(layers)
        assert trial.user_attrs[ARCHITECTURE_ATTR] == {
            "model.ffn_width": width,
            "model.num_layers": layers,
            "model.num_heads": 2,
        }
        history = client.get_metric_history(run.info.run_id, "train_loss")
        assert [m.step for m in history] == [1]  # one epoch under debug=smoke
    _assert_pareto_tags_match_the_study(tmp_path, children)

    # study.n_trials is the study's total: the same command again adds nothing ...
    same = run_cli(tmp_path, *SMOKE)
    assert same.returncode == 0, same.stderr
    assert "has its 2 trained configurations" in same.stdout
    assert len(_study(tmp_path).trials) == len(complete)
    # (but for a front latency still short of steady sessions, timed again in a parent run of
    # its own that trains nothing: a slow spell of this machine's can last through a run)
    confirming = "Confirming the front" in same.stdout
    _, parents, _ = _mlflow(tmp_path)
    assert len(parents) == 1 + confirming
    # ... and a larger total resumes the study up to it.
    again = run_cli(tmp_path, *SMOKE, "debug.overrides.study.n_trials=4")
    assert again.returncode == 0, again.stderr
    resumed = f"Resuming study 'bert_ffn-smoke' ({len(complete)} earlier trials, 2 of 4"
    assert resumed in again.stdout
    _assert_one_training_per_config(_study(tmp_path), trainings=4)
    _, parents, children = _mlflow(tmp_path)
    assert len(parents) == 2 + confirming and len(children) == 4 * len(BACKENDS)
    _assert_pareto_tags_match_the_study(tmp_path, children)


@pytest.mark.slow
def test_failing_backend_keeps_the_other_points(tmp_path):
    # Opset 1 cannot express the model: every backend that starts from the ONNX export (ONNX
    # Runtime's and OpenVINO's) fails to export.
    # One backend that does not export, one of each runtime that does.
    listed = (*SMOKE, "deploy.backends=[eager,onnxruntime,openvino]")
    result = run_cli(tmp_path, *listed, "debug.overrides.study.n_trials=1", "deploy.onnx.opset=1")
    assert result.returncode == 0, result.stderr
    backends = set(runnable_backends(*listed))
    exporting = {b for b in backends if b.startswith(("onnxruntime", "openvino"))}
    assert exporting == {"onnxruntime", "openvino"}
    study = _study(tmp_path)
    by_backend = {t.params["deploy.backend"]: t for t in study.trials}
    assert set(by_backend) == backends
    for backend, trial in by_backend.items():
        if backend in exporting:
            assert trial.state == TrialState.FAIL
            assert "opset" in trial.user_attrs["fail_reason"].lower()
        else:
            assert trial.state == TrialState.COMPLETE
    _, _, children = _mlflow(tmp_path)
    statuses = {r.data.tags["deploy.backend"]: r for r in children}
    assert {b for b, r in statuses.items() if r.info.status == "FAILED"} == exporting
    assert "opset" in statuses["onnxruntime"].data.tags["failure_reason"].lower()
    assert "opset" in statuses["openvino"].data.tags["failure_reason"].lower()
    # Failed points, not a failed trial: the trial completes with another backend's point.
    assert study.trials[0].state == TrialState.COMPLETE
    assert study.trials[0].params["deploy.backend"] not in exporting
    assert f"{len(exporting)} point(s) failed on their backend" in result.stdout
    assert "trial(s) failed" not in result.stdout


# oneDNN capped below its bf16 kernels, as on a CPU without native bf16 (AVX2-only machines).
NO_BF16 = {"ONEDNN_MAX_CPU_ISA": "AVX2"}


@pytest.mark.slow
def test_a_backend_this_machine_cannot_run_is_left_out_with_its_reason(tmp_path):
    searched = "search_space={deploy.backend:'choice(eager,bf16,onnxruntime)'}"
    result = run_cli(tmp_path, *SMOKE, "debug.overrides.study.n_trials=1", searched, env=NO_BF16)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("is left out on this machine") == 1
    assert "Backend bf16 is left out on this machine:" in result.stdout
    study = _study(tmp_path)
    # No failed point for it: every trial is complete, one per backend that runs.
    assert {t.state for t in study.trials} == {TrialState.COMPLETE}
    assert {t.params["deploy.backend"] for t in study.trials} == {"eager", "onnxruntime"}
    _, parents, _ = _mlflow(tmp_path)
    assert parents[0].data.params["deploy.left_out"].startswith("bf16: ")
    assert "bf16" not in parents[0].data.params["deploy.backends"]


# Slow: the capped ISA is read as PyTorch is imported, so the command starts a new interpreter.
@pytest.mark.slow
def test_no_runnable_backend_stops_before_anything_is_created(tmp_path):
    result = run_cli(tmp_path, *SMOKE, "deploy.backend=bf16", env=NO_BF16)
    assert result.returncode == 2
    assert "key 'deploy.backend': no listed backend runs on this machine (bf16: " in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "optuna.db").exists()
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_a_resume_with_other_backend_choices_is_refused_before_training(tmp_path):
    first = run_cli(
        tmp_path,
        *SMOKE,
        "debug.overrides.study.n_trials=1",
        "search_space={deploy.backend:'choice(eager)'}",
    )
    assert first.returncode == 0, first.stderr
    result = run_cli(
        tmp_path,
        *SMOKE,
        "debug.overrides.study.n_trials=2",
        "search_space={deploy.backend:'choice(eager,onnxruntime)'}",
        # A deliberate change of a setting in a refused run is not recorded.
        "study.max_accuracy_drop=0.02",
        "study.change_settings=[study.max_accuracy_drop]",
    )
    assert result.returncode == 2
    assert "settings_changes" not in _study(tmp_path).user_attrs
    assert _study(tmp_path).user_attrs["settings"]["study.max_accuracy_drop"] is None
    assert (
        "key 'deploy.backend': study 'bert_ffn-smoke' deploys on choice(eager), this run "
        "would on choice(eager, onnxruntime)"
    ) in result.stderr
    assert "Trial" not in result.stdout
    assert len(_study(tmp_path).trials) == 1


@pytest.mark.slow
def test_a_study_ranking_by_the_fastest_call_keeps_it_as_its_objective(tmp_path):
    backends = "search_space={deploy.backend:'choice(eager,onnxruntime)'}"
    first = run_cli(
        tmp_path,
        *SMOKE,
        "debug.overrides.study.n_trials=1",
        backends,
        "deploy.latency.statistic=min",
    )
    assert first.returncode == 0, first.stderr
    assert "add val_accuracy, latency_ms_min and the pareto tag" in first.stdout
    study = _study(tmp_path)
    assert study.metric_names == ["val_accuracy", "latency_ms_min"]
    complete = {t.number: t for t in study.get_trials(states=(TrialState.COMPLETE,))}
    client, parents, children = _mlflow(tmp_path)
    assert parents[0].data.params["latency.statistic"] == "min"
    assert len(children) == len(complete) == 2  # one trained model, on two backends
    for run in children:
        metrics = run.data.metrics
        # Optuna's objective is the point's fastest call as the point was made, never slower
        # than its median.
        objective = complete[int(run.data.tags["optuna.trial_number"])].values[1]
        assert _first(client, run, "latency_ms_min") == pytest.approx(objective)
        assert metrics["latency_ms_min"] <= metrics["latency_ms_p50"]
    front_csv = client.download_artifacts(parents[0].info.run_id, "pareto/front.csv", str(tmp_path))
    assert open(front_csv).readline().split(",")[:5] == [
        "trial",
        "backend",
        "val_accuracy",
        "latency_ms_min",
        "latency_ms_p95",
    ]
    # A resume that would rank by p50 is refused before training; nothing is renamed.
    again = run_cli(tmp_path, *SMOKE, "debug.overrides.study.n_trials=2", backends)
    assert again.returncode == 2
    assert "key 'deploy.latency.statistic'" in again.stderr
    assert 'created with deploy.latency.statistic="min"' in again.stderr
    assert _study(tmp_path).metric_names == ["val_accuracy", "latency_ms_min"]
    assert len(_study(tmp_path).trials) == len(study.trials)


@pytest.mark.slow
def test_the_front_is_confirmed_only_where_its_keys_can_be_rebuilt_here(tmp_path):
    backends = "search_space={deploy.backend:'choice(eager,onnxruntime)'}"
    first = run_cli(
        tmp_path,
        *SMOKE,
        "debug.overrides.study.n_trials=1",
        backends,
        "deploy.latency.front_sessions=1",
    )
    assert first.returncode == 0, first.stderr
    # One session per front latency asked for: nothing is timed again.
    assert "Confirming the front" not in first.stdout
    sessions = stored_sessions(_study(tmp_path).user_attrs)
    assert {len(found) for found in sessions.values()} == {1}
    made_first = {t.number for t in _study(tmp_path).trials}
    # The next run exports ONNX at another opset: the first run's keys are not this run's, and
    # rounds timed here must not be added to them.
    # Every session counts (none is judged for steadiness), so each new front key is timed
    # once more, exactly.
    again = run_cli(
        tmp_path,
        *SMOKE,
        "debug.overrides.study.n_trials=2",
        backends,
        "deploy.onnx.opset=16",
        "deploy.latency.steady_within=null",
    )
    assert again.returncode == 0, again.stderr
    assert "Confirming the front" in again.stdout
    study = _study(tmp_path)
    counts = {d: len(s) for d, s in stored_sessions(study.user_attrs).items()}
    front = [p for p in study_points(study) if p.pareto]
    assert front
    for point in front:
        digest = study.trials[point.trial_number].user_attrs[LATENCY_KEY_ATTR]
        if point.trial_number in made_first:
            assert counts[digest] == 1
            assert (
                f"#{point.trial_number} {point.backend} not timed again (its latency key here "
                "differs from the one it was measured under" in again.stdout
            )
        else:
            assert counts[digest] == 2


@pytest.mark.slow
def test_a_finished_study_s_run_confirms_a_front_short_of_sessions_and_nothing_else(tmp_path):
    # Rounds not judged: every session counts, so the session counts are exact.
    args = (
        *SMOKE,
        "debug.overrides.study.n_trials=1",
        "search_space={deploy.backend:'choice(eager,onnxruntime)'}",
        "deploy.latency.steady_within=null",
    )
    first = run_cli(tmp_path, *args, "deploy.latency.front_sessions=1")
    assert first.returncode == 0, first.stderr
    assert "Confirming the front" not in first.stdout
    trials = len(_study(tmp_path).trials)
    # Nothing left to train, but the front rests on one session per key where two are asked.
    again = run_cli(tmp_path, *args)
    assert again.returncode == 0, again.stderr
    assert "this run confirms its front" in again.stdout
    assert "Confirming the front" in again.stdout
    study = _study(tmp_path)
    assert len(study.trials) == trials
    counts = {d: len(s) for d, s in stored_sessions(study.user_attrs).items()}
    front = [p for p in study_points(study) if p.pareto]
    assert front
    for point in front:
        assert counts[study.trials[point.trial_number].user_attrs[LATENCY_KEY_ATTR]] == 2
    # Its new parent run holds the front.
    client, parents, _ = _mlflow(tmp_path)
    assert len(parents) == 2
    newest = max(parents, key=lambda run: run.info.start_time)
    assert "pareto/front.csv" in {
        f.path for f in client.list_artifacts(newest.info.run_id, "pareto")
    }
    # Once confirmed, a run of the finished study does nothing, and starts no run; nor does
    # one asking for more sessions of keys it cannot time here (another ONNX opset).
    for more in ((), ("deploy.latency.front_sessions=3", "deploy.onnx.opset=16")):
        third = run_cli(tmp_path, *args, *more)
        assert third.returncode == 0, third.stderr
        assert "has its 1 trained configurations (study.n_trials); raise" in third.stdout
        assert "Confirming the front" not in third.stdout
        assert len(_mlflow(tmp_path)[1]) == 2


@pytest.mark.slow
def test_accuracy_drop_constraint_reaches_optuna_and_the_front(tmp_path):
    result = run_cli(
        tmp_path,
        *SMOKE,
        TWO_BACKENDS,
        "debug.overrides.study.n_trials=1",
        "study.max_accuracy_drop=0.0",
    )
    assert result.returncode == 0, result.stderr
    study = _study(tmp_path)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    reference = complete[0].user_attrs["reference_accuracy"]
    for trial in complete:
        # Under its name, where Optuna's samplers and best_trials read constraints.
        assert trial.constraints == {"accuracy_drop": pytest.approx(reference - trial.values[0])}
    feasible = {t.number for t in complete if t.values[0] >= reference}
    _, _, children = _mlflow(tmp_path)
    on_front = {
        int(r.data.tags["optuna.trial_number"]) for r in children if r.data.tags["pareto"] == "true"
    }
    assert on_front and on_front <= feasible
    # Optuna's own front honours the same constraint: the feasible points its values (the
    # latency known when each was made, not the table's since) leave undominated.
    values = {t.number: t.values for t in complete if t.number in feasible}

    def dominated(number: int) -> bool:
        accuracy, latency = values[number]
        return any(
            a >= accuracy and ms <= latency and (a > accuracy or ms < latency)
            for a, ms in values.values()
        )

    assert {t.number for t in study.best_trials} == {n for n in values if not dominated(n)}


def _user_experiment(tmp_path, body: str) -> str:
    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text(textwrap.dedent(body))
    return str(tmp_path / "conf")


def test_bad_search_space_fails_before_anything_is_created(tmp_path):
    config_dir = _user_experiment(
        tmp_path,
        """\
        # @package _global_
        defaults:
          - /search_spaces/regularization@search_space
        study:
          name: mine
        search_space:
          train.lr: tag(log, interval(1e-3, 1e-5))
        """,
    )
    result = run_cli(tmp_path, "--config-dir", config_dir, "+experiment=mine", "debug=smoke")
    assert result.returncode == 2
    assert "mine.yaml" in result.stderr
    assert "'train.lr'" in result.stderr
    assert "low 0.001 > high 1e-05" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "optuna.db").exists()
    assert not (tmp_path / "mlflow.db").exists()


def test_unknown_key_in_a_search_space_file_names_the_file(tmp_path):
    config_dir = _user_experiment(
        tmp_path,
        """\
        # @package _global_
        defaults:
          - /search_spaces/mixup@search_space
        study:
          name: mine
        search_space:
          train.learning_rate: choice(0.1, 0.2)
        """,
    )
    result = run_cli(tmp_path, "--config-dir", config_dir, "+experiment=mine", "debug=smoke")
    assert result.returncode == 2
    assert "'train.learning_rate'" in result.stderr and "unknown key" in result.stderr
    assert not (tmp_path / "optuna.db").exists()


@pytest.mark.slow
def test_diverging_trials_are_failed_with_reason_and_the_study_goes_on(tmp_path):
    # A user experiment on a local JSONL file, composed as the README shows.
    data = tmp_path / "reviews.jsonl"
    data.write_text("".join(f'{{"review": "film {i}", "stars": {i % 2}}}\n' for i in range(200)))
    config_dir = _user_experiment(
        tmp_path,
        f"""\
        # @package _global_
        defaults:
          - override /data: csv
        study:
          name: mine
        data:
          path: {data}
          text_column: review
          label_column: stars
        search_space:
          train.lr: choice(1e30)
          model.ffn_width: choice(512, 1024)
        """,
    )
    result = run_cli(tmp_path, "--config-dir", config_dir, "+experiment=mine", "debug=smoke")
    assert "Data: 160 train / 20 validation examples, labels ['0', '1']" in result.stdout
    # Training failed, so no point exists: failed trials, not failed points.
    assert "2 trial(s) failed before any point" in result.stdout
    assert "point(s) failed on their backend" not in result.stdout
    assert result.returncode == 0, result.stderr
    study = _study(tmp_path, "mine-smoke")
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.FAIL]
    for trial in study.trials:
        assert "train_loss became" in trial.user_attrs["fail_reason"]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("mine-smoke")
    runs = client.search_runs([experiment.experiment_id], "tags.`tuner.role` = 'trial'")
    assert len(runs) == 2
    for run in runs:
        assert run.info.status == "FAILED"
        assert "train_loss became" in run.data.tags["failure_reason"]


def test_command_line_value_of_a_searched_key_is_checked_before_anything_starts(tmp_path):
    # Setting a searched key on the command line fixes it, so its value is checked like any.
    result = run_cli(tmp_path, *SMOKE, "train.init=he")
    assert result.returncode == 2
    assert "'train.init'" in result.stderr and "'he'" in result.stderr
    assert "choose one of auto, kaiming, xavier" in result.stderr
    assert not (tmp_path / "optuna.db").exists()


def test_help_lists_the_config_groups(tmp_path):
    result = warm.run(
        [sys.executable, "-m", "tuner", "--help"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0
    for group in ("data:", "model:", "study:", "debug:", "experiment:"):
        assert group in result.stdout
