"""The study's distillation teacher: trained once, stored with the study, reused by resumes and
retraining commands, refused when it does not fit, and a failed one stops the study. Real
`debug=smoke` studies of bert_ffn run in this process."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
from pathlib import Path

import optuna
import pytest
import torch
from conftest import REPO, TINY_BERT, runnable_backends
from hydra.core.override_parser.overrides_parser import OverridesParser
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

import tuner.study.run
import tuner.trial.model_training
from tuner.config.compose import compose_config
from tuner.data import load_splits
from tuner.deploy.backends import BACKENDS
from tuner.errors import ConfigError, StudyStopped
from tuner.keys import (
    ARCHITECTURE_ATTR,
    EAGER_ACCURACY_ATTR,
    RETRAIN_TAG,
    SETTINGS_ATTR,
    START_FROM_TAG,
    STORED_TEACHERS_ATTR,
    TEACHER_LOADED_TAG,
    TEACHER_OF_ATTR,
    TEACHER_TAG,
    TEACHER_TRIAL_ATTR,
)
from tuner.models.recipe import ModelRecipe
from tuner.store import budget
from tuner.study.run import run_study
from tuner.trial.teacher import StoredTeacher, save_teacher

TrialState = optuna.trial.TrialState
SMOKE = ("+experiment=bert_ffn", "debug=smoke", "deploy.backend=eager")
STUDY = "bert_ffn-smoke"
MINILM_YAML = REPO / "conf" / "model" / "minilm.yaml"


@pytest.fixture
def study_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's artifacts go under the working directory
    return tmp_path


def _args(directory: Path, *overrides: str) -> list[str]:
    return [
        *SMOKE,
        f"study.storage=sqlite:///{directory}/optuna.db",
        f"tracking.uri=sqlite:///{directory}/mlflow.db",
        *overrides,
    ]


def _image_args(directory: Path, *overrides: str) -> list[str]:
    """The image experiment's smoke study on digits, stored in `directory`."""
    return [
        "+experiment=resnet_mixup",
        "debug=smoke",
        "data=digits",
        f"study.storage=sqlite:///{directory}/optuna.db",
        f"tracking.uri=sqlite:///{directory}/mlflow.db",
        *overrides,
    ]


def _run(directory: Path, *overrides: str):
    args = _args(directory, *overrides)
    return run_study(compose_config(args), overrides=args)


def _study(directory: Path, name: str = STUDY) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{directory}/optuna.db")


def _teacher_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.trials if TEACHER_TRIAL_ATTR in t.system_attrs]


def _teacher_and_retries(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The teacher trial and the trials that retry it (they carry no teacher record)."""
    (teacher,) = _teacher_trials(study)
    return [t for t in study.trials if budget.configuration_of(t) == teacher.number]


def _configurations(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.trials if budget.is_configuration(t)]


@pytest.mark.slow
def test_the_teacher_is_trained_once_stored_and_reused_by_resumes(study_dir, capsys):
    _run(study_dir, "train.distill.alpha=0.5")
    study = _study(study_dir)
    (teacher,) = _teacher_trials(study)
    assert teacher.number == 0 and teacher.state == TrialState.COMPLETE
    assert teacher.user_attrs[TEACHER_OF_ATTR] == "auto"
    # The unedited model: the tiny encoder's 6 layers at the FFN width of its config (MiniLM's),
    # with its 2 heads.
    assert teacher.user_attrs[ARCHITECTURE_ATTR] == {
        "model.ffn_width": 1536,
        "model.num_layers": 6,
        "model.num_heads": 2,
    }
    stored = study.user_attrs[STORED_TEACHERS_ATTR]["auto"]
    assert stored["trial"] == 0
    location = Path(stored["uri"].removeprefix("file://"))
    assert sorted(p.name for p in location.iterdir()) == ["labels.json", "teacher.safetensors"]
    client = MlflowClient(f"sqlite:///{study_dir}/mlflow.db")
    (student,) = [t for t in _configurations(study) if t.number != 0]
    run = client.get_run(student.user_attrs["mlflow_run_id"])
    assert run.data.params["train.distill.alpha"] == "0.5"
    assert run.data.tags[TEACHER_TAG] == stored["uri"]
    overrides = OverridesParser.create().parse_overrides(
        shlex.split(run.data.tags[RETRAIN_TAG])[3:]
    )
    pinned = {o.key_or_group: o.value() for o in overrides}
    assert pinned["train.distill.teacher"] == stored["uri"]

    # The teacher trial's run holds it as an artifact, also readable by its runs:/ URI.
    teacher_run = teacher.user_attrs["mlflow_run_id"]
    by_run = StoredTeacher.load(f"runs:/{teacher_run}/teacher", f"sqlite:///{study_dir}/mlflow.db")
    assert by_run.weights.read_bytes() == (location / "teacher.safetensors").read_bytes()
    assert len(by_run.label_names) == 2
    assert by_run.recipe.model["num_layers_fraction"] is None

    # A resume reuses the stored teacher.
    capsys.readouterr()
    _run(study_dir, "train.distill.alpha=0.5", "debug.overrides.study.n_trials=3")
    study = _study(study_dir)
    assert len(_teacher_trials(study)) == 1
    # The teacher counts as one of study.n_trials: trial 0, the teacher, one student.
    assert len(_configurations(study)) == 3
    assert "Training the distillation teacher" not in capsys.readouterr().out

    # A teacher whose files are gone is trained again, once, with a notice.
    shutil.rmtree(location)
    _run(study_dir, "train.distill.alpha=0.5", "debug.overrides.study.n_trials=4")
    out = capsys.readouterr().out
    assert "cannot be loaded" in out and "trained again, once" in out
    study = _study(study_dir)
    first, second = _teacher_trials(study)
    assert second.state == TrialState.COMPLETE
    assert study.user_attrs[STORED_TEACHERS_ATTR]["auto"]["trial"] == second.number
    assert len(_configurations(study)) == 4


@pytest.mark.slow
def test_a_teacher_trial_interrupted_after_storing_its_teacher_loads_it_when_retried(
    study_dir, monkeypatch, capsys
):
    store = tuner.trial.model_training.record_stored

    def store_then_interrupt(*args) -> None:
        store(*args)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C before any point is written

    monkeypatch.setattr(tuner.trial.model_training, "record_stored", store_then_interrupt)
    # Two backends: the trial's own point and another one.
    args = [
        *(a for a in _args(study_dir) if not a.startswith("deploy.backend=")),
        "+search_space={deploy.backend:'choice(eager,int8_dynamic)'}",
        "train.distill.alpha=0.5",
        "debug.overrides.train.epochs=2",
    ]
    with pytest.raises(KeyboardInterrupt):
        run_study(compose_config(args), overrides=args)
    study = _study(study_dir)
    interrupted, retry = _teacher_and_retries(study)
    assert (interrupted.state, retry.state) == (TrialState.FAIL, TrialState.WAITING)
    assert len(study.trials) == 2  # no point was written
    record = study.user_attrs[STORED_TEACHERS_ATTR]["auto"]
    assert record["trial"] == 0
    curve = interrupted.user_attrs["val_accuracy_curve"]
    epochs = record["training"]["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert [e["val_accuracy"] for e in epochs] == curve

    monkeypatch.undo()
    capsys.readouterr()
    run_study(compose_config(args), overrides=args)
    assert "Loading the distillation teacher that trial #0 trained" in capsys.readouterr().out
    study = _study(study_dir)
    # Not trained again: the record still names trial #0's files, which the student learnt from.
    assert study.user_attrs[STORED_TEACHERS_ATTR]["auto"] == record
    interrupted, retry = _teacher_and_retries(study)
    assert retry.state == TrialState.COMPLETE
    # The stored weights, evaluated again, give the accuracy of training's last epoch.
    assert retry.user_attrs[EAGER_ACCURACY_ATTR] == curve[-1]
    assert retry.user_attrs["val_accuracy_curve"] == curve
    client = MlflowClient(f"sqlite:///{study_dir}/mlflow.db")
    points = [t for t in study.trials if t.user_attrs.get("trained_in_trial") == retry.number]
    # Every backend of the two this machine runs (by their availability checks), once.
    runnable = runnable_backends(*(a for a in args if not a.startswith(("study.", "tracking."))))
    assert sorted(t.user_attrs["deploy.backend"] for t in points) == sorted(runnable)
    for point in points:
        run = client.get_run(point.user_attrs["mlflow_run_id"])
        assert run.data.tags[TEACHER_LOADED_TAG] == f"{record['uri']} (trained in trial #0)"
        # Its run shows the training that made it, epoch by epoch (the deployed point's
        # accuracy follows at the last step, as in every run).
        history = {
            key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
            for key in ("train_loss", "val_accuracy")
        }
        assert history["train_loss"] == [(e["epoch"], e["train_loss"]) for e in epochs]
        assert history["val_accuracy"][:2] == [(1, curve[0]), (2, curve[1])]
        assert run.data.metrics["train_seconds"] == record["training"]["seconds"]
    (student,) = [t for t in _configurations(study) if budget.configuration_of(t) != 0]
    tags = client.get_run(student.user_attrs["mlflow_run_id"]).data.tags
    assert tags[TEACHER_TAG] == record["uri"]
    # Trained in this process, as the teacher was.
    assert record["training"]["trained_on"] == tags["train.trained_on"]


@pytest.mark.slow
def test_a_trial_named_as_teacher_is_its_configuration_trained_again(study_dir):
    _run(study_dir, "train.distill.alpha=0", "debug.overrides.study.n_trials=1")
    (first,) = _configurations(_study(study_dir))
    recorded = len(_study(study_dir).trials)
    named = (
        "train.distill.alpha=0.5",
        "train.distill.teacher=0",
        "debug.overrides.study.n_trials=3",
    )
    # bert_ffn's distilled students start from the teacher, and trial 0 is an edited
    # configuration: refused before anything trains.
    with pytest.raises(ConfigError, match=r"train.distill.teacher=0 is already edited \(model\."):
        _run(study_dir, *named)
    assert len(_study(study_dir).trials) == recorded
    _run(study_dir, *named, "train.distill.start_from=pretrained")
    study = _study(study_dir)
    (teacher,) = _teacher_trials(study)
    assert teacher.system_attrs[TEACHER_TRIAL_ATTR]["params"] == {
        **first.params,
        "train.distill.alpha": 0.0,
        "train.distill.start_from": "pretrained",
    }
    assert study.user_attrs[STORED_TEACHERS_ATTR]["0"]["trial"] == teacher.number
    # Training is seeded: the configuration trained again is the same model.
    assert teacher.user_attrs[EAGER_ACCURACY_ATTR] == first.user_attrs[EAGER_ACCURACY_ATTR]
    # The teacher counts as one of study.n_trials: trial 0, the teacher, one student.
    assert len(_configurations(study)) == 3


@pytest.mark.slow
@pytest.mark.parametrize("start_from", ["pretrained", "teacher"])
def test_a_distilled_point_retrains_to_the_same_accuracy(study_dir, start_from):
    _run(
        study_dir,
        "train.distill.alpha=0.9",
        f"train.distill.start_from={start_from}",
        "debug.overrides.study.n_trials=3",
    )
    study = _study(study_dir)
    # The second student: the teacher was loaded in this process before it trained, not in
    # its retraining run; its training must not depend on that.
    *_, student = [t for t in _configurations(study) if TEACHER_TRIAL_ATTR not in t.system_attrs]
    client = MlflowClient(f"sqlite:///{study_dir}/mlflow.db")
    command = shlex.split(
        client.get_run(student.user_attrs["mlflow_run_id"]).data.tags[RETRAIN_TAG]
    )
    overrides = command[3:]
    run_study(compose_config(overrides), overrides=overrides)
    retrained_name = f"bert_ffn-retrain-{student.number}-eager-smoke"
    (retrained,) = _study(study_dir, retrained_name).get_trials(states=(TrialState.COMPLETE,))
    # Only the student trains there: the teacher comes from where the study stored it.
    assert not _teacher_trials(_study(study_dir, retrained_name))
    assert retrained.values[0] == pytest.approx(student.values[0], abs=1e-9)


@pytest.mark.slow
def test_a_teacher_that_fails_to_train_stops_the_study_before_any_student(study_dir):
    # Momentum SGD at this rate diverges at once; the teacher trains with the typed value.
    with pytest.raises(StudyStopped, match="did not train: TrialFailed: train_loss became"):
        _run(study_dir, "train.distill.alpha=0.5", "train.optimizer=sgd", "train.lr=1e30")
    study = _study(study_dir)
    assert [(t.number, t.state) for t in study.trials] == [(0, TrialState.FAIL)]


def _stored_teacher(directory: Path, labels: list[str], **recipe_changes) -> Path:
    """A tiny BERT saved as a teacher of the bert_ffn studies here (it says it reads their
    model's inputs), its recipe changed as given."""
    torch.manual_seed(0)
    model = ModelRecipe(TINY_BERT.model, len(labels)).build()
    studies_model = {"name_or_path": OmegaConf.load(MINILM_YAML).name_or_path}
    recipe = ModelRecipe({**TINY_BERT.model, **studies_model, **recipe_changes}, len(labels))
    return save_teacher(model, recipe, labels, directory / "teacher")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.distill.alpha=1.5", "key 'train.distill.alpha': 1.5 must be a weight in [0, 1]"),
        ("train.distill.temperature=0", "key 'train.distill.temperature': 0 must be a number > 0"),
        ("train.distill.teacher=7", "key 'train.distill.teacher': trial #7 does not exist"),
        ("train.distill.teacher=./nowhere", "key 'train.distill.teacher': ./nowhere holds no"),
    ],
)
def test_bad_distillation_settings_are_refused_before_training(study_dir, override, message):
    with pytest.raises(ConfigError) as error:
        _run(study_dir, "train.distill.alpha=0.5", override)
    assert message in str(error.value)
    assert (
        not optuna.get_all_study_names(f"sqlite:///{study_dir}/optuna.db")
        or not _study(study_dir).trials
    )


def test_hidden_state_transfer_is_refused_for_models_without_transformer_layers(study_dir):
    args = [
        "+experiment=resnet_mixup",
        "debug=smoke",
        f"study.storage=sqlite:///{study_dir}/optuna.db",
        f"tracking.uri=sqlite:///{study_dir}/mlflow.db",
        "train.distill.hidden_weight=1.0",
    ]
    with pytest.raises(ConfigError, match="key 'train.distill.hidden_weight': timm models have"):
        run_study(compose_config(args), overrides=args)


def test_a_stored_teacher_of_other_labels_or_inputs_is_refused(study_dir):
    other_labels = _stored_teacher(study_dir / "a", ["bad", "good", "neutral"])
    with pytest.raises(ConfigError, match="key 'train.distill.teacher'.*predicts labels"):
        _run(study_dir, "train.distill.alpha=0.5", f"train.distill.teacher={other_labels}")
    other_vocabulary = _stored_teacher(study_dir / "b", ["neg", "pos"], name_or_path="bert-base")
    with pytest.raises(ConfigError, match="reads inputs of model.name_or_path=bert-base"):
        _run(study_dir, "train.distill.alpha=0.5", f"train.distill.teacher={other_vocabulary}")


@pytest.mark.slow
def test_distilled_students_can_start_from_the_teachers_weights_and_retrain_from_them(study_dir):
    # Students barely move from where they start (their rate is drawn from one tiny value;
    # the teacher trains at the experiment's own) and keep the whole architecture, so a student
    # that starts from the teacher predicts what the teacher does.
    students = (
        "search_space={train.lr:'choice(1e-12)'}",
        "model.ffn_width_fraction=1.0",
        "model.num_layers_fraction=1.0",
        "train.distill.start_from=teacher",
    )
    _run(study_dir, *students, "train.distill.alpha=0.5")
    study = _study(study_dir)
    (teacher,) = _teacher_trials(study)
    (student,) = [t for t in _configurations(study) if t.number != teacher.number]
    assert (
        teacher.system_attrs[TEACHER_TRIAL_ATTR]["params"]["train.distill.start_from"]
        == "pretrained"
    )
    assert student.params["train.lr"] == 1e-12
    accuracy = teacher.user_attrs[EAGER_ACCURACY_ATTR]
    assert student.user_attrs[EAGER_ACCURACY_ATTR] == accuracy
    # The retraining command pins the teacher it started from; it starts there again.
    stored = study.user_attrs[STORED_TEACHERS_ATTR]["auto"]["uri"]
    client = MlflowClient(f"sqlite:///{study_dir}/mlflow.db")
    run = client.get_run(student.user_attrs["mlflow_run_id"])
    assert run.data.tags[TEACHER_TAG] == stored
    command = shlex.split(run.data.tags[RETRAIN_TAG])
    overrides = OverridesParser.create().parse_overrides(command[3:])
    pinned = {o.key_or_group: o.value() for o in overrides}
    assert pinned["train.distill.teacher"] == stored
    assert pinned["train.distill.start_from"] == run.data.tags[START_FROM_TAG] == "teacher"
    assert pinned["train.distill.temperature"] == 1.0  # bert_ffn's
    run_study(compose_config(command[3:]), overrides=command[3:])
    retrained_name = f"bert_ffn-retrain-{student.number}-eager-smoke"
    (retrained,) = _study(study_dir, retrained_name).get_trials(states=(TrialState.COMPLETE,))
    assert retrained.user_attrs[EAGER_ACCURACY_ATTR] == accuracy

    # A resume whose model differs from the stored teacher's in anything but the edits is
    # refused: its students would be copies of a model it does not describe.
    with pytest.raises(
        ConfigError, match="has model.dropout=0.1, the study's model has model.dropout=0.2"
    ):
        _run(study_dir, *students, "train.distill.alpha=0.5", "model.dropout=0.2")

    # At alpha 0 there is no teacher: the same student starts from the pretrained weights and
    # predicts otherwise (the equality above is the teacher's doing).
    other = study_dir / "plain"
    other.mkdir()
    _run(other, *students, "train.distill.alpha=0", "debug.overrides.study.n_trials=1")
    (plain,) = _study(other).trials
    assert TEACHER_TRIAL_ATTR not in plain.system_attrs
    assert plain.user_attrs[EAGER_ACCURACY_ATTR] != accuracy


_ORT_INT8 = BACKENDS.get("onnxruntime_int8_static").unavailable_reason()


@pytest.mark.slow
@pytest.mark.skipif(_ORT_INT8 is not None, reason=f"onnxruntime_int8_static: {_ORT_INT8}")
@pytest.mark.parametrize(
    ("size", "same_as_teacher"),
    [
        ("{model.width_multiplier:'choice(1.0)',model.depth:'choice(2)'}", True),
        ("{model.width_multiplier:'choice(0.25)',model.depth:'choice(1)'}", False),
    ],
)
def test_cnn_students_start_from_the_teacher_cut_to_their_width_and_depth(
    study_dir, size, same_as_teacher
):
    # Students that barely move from where they start (lr 1e-12, no mixing): one of the
    # teacher's own size predicts what the teacher does; one of a quarter of its width and one
    # block per stage is cut from it, trains and deploys like any model.
    args = _image_args(
        study_dir,
        "search_space={train.lr:'choice(1e-12)',train.mixup_alpha:'choice(0)',"
        "train.cutmix_alpha:'choice(0)',deploy.backend:'choice(eager,onnxruntime_int8_static)'}",
        f"+search_space={size}",
        "train.distill.alpha=0.5",
        "train.distill.start_from=teacher",
        # Enough steps for the teacher's batch-norm statistics to settle, which the student's
        # training (its weights all but frozen) still updates.
        "debug.overrides.train.epochs=6",
    )
    run_study(compose_config(args), overrides=args)
    study = _study(study_dir, "resnet_mixup-smoke")
    (teacher,) = _teacher_trials(study)
    (student,) = [t for t in _configurations(study) if t.number != teacher.number]
    assert student.state == TrialState.COMPLETE
    client = MlflowClient(f"sqlite:///{study_dir}/mlflow.db")
    runs = client.search_runs(
        [client.get_experiment_by_name("resnet_mixup-smoke").experiment_id],
        f"tags.`tuner.trained_in_trial` = '{student.number}'",
    )
    assert {r.data.tags["deploy.backend"] for r in runs} == {"eager", "onnxruntime_int8_static"}
    assert "teacher" in {r.data.tags.get(START_FROM_TAG) for r in runs}
    accuracy = teacher.user_attrs[EAGER_ACCURACY_ATTR]
    assert accuracy > 0.3  # well above chance (0.1): its predictions are worth comparing
    if same_as_teacher:
        # Training at lr 1e-12 still updates the norms' running statistics: one example of the
        # 128 may tip over, no more.
        assert abs(student.user_attrs[EAGER_ACCURACY_ATTR] - accuracy) <= 1 / 128


def test_starting_from_the_teacher_is_refused_where_its_weights_cannot_seed_students(study_dir):
    with pytest.raises(ConfigError, match="key 'train.distill.start_from'.*pretrained or teacher"):
        _run(study_dir, "train.distill.start_from=scratch")
    # A searched model key that is no structural edit (nor a size a student can be cut to).
    with pytest.raises(
        ConfigError,
        match="key 'train.distill.start_from'.*the space searches model.dropout, which does not "
        "size a model",
    ):
        _run(
            study_dir,
            "train.distill.start_from=teacher",
            "+search_space={model.dropout:'choice(0.1,0.2)'}",
        )
    # A CNN's students are built at their searched width and depth and cut from the teacher:
    # a half-width teacher does not fit the space's full-width students.
    args = _image_args(study_dir, "train.distill.start_from=teacher")
    cfg = compose_config(args)
    half_width = {**OmegaConf.to_container(cfg.model), "width_multiplier": 0.5}
    labels = load_splits(cfg.data).label_names
    recipe = ModelRecipe(half_width, len(labels))
    narrow = save_teacher(recipe.build(), recipe, labels, study_dir / "narrow" / "teacher")
    args.append(f"train.distill.teacher={narrow}")
    with pytest.raises(
        ConfigError,
        match=r"key 'train.distill.start_from'.*the teacher at .*narrow/teacher does not fit a "
        r"student of model.width_multiplier=1.0, model.depth=1: layer1 has 64 channels, the "
        r"teacher's only 32",
    ):
        run_study(compose_config(args), overrides=args)
    labels = ["fresh", "rotten"]
    edited = _stored_teacher(study_dir / "a", labels, ffn_width=16)
    with pytest.raises(ConfigError, match=r"is already edited \(model.ffn_width=16\)"):
        _run(study_dir, "train.distill.start_from=teacher", f"train.distill.teacher={edited}")
    other_dropout = _stored_teacher(study_dir / "b", labels, dropout=0.3)
    with pytest.raises(
        ConfigError, match="has model.dropout=0.3, the study's model has model.dropout=0.1"
    ):
        _run(
            study_dir, "train.distill.start_from=teacher", f"train.distill.teacher={other_dropout}"
        )
    # Every refusal came before any trial, and before the study's settings were recorded: a
    # corrected command may still choose them.
    for name in optuna.get_all_study_names(f"sqlite:///{study_dir}/optuna.db"):
        refused = optuna.load_study(study_name=name, storage=f"sqlite:///{study_dir}/optuna.db")
        assert not refused.trials
        assert SETTINGS_ATTR not in refused.user_attrs
