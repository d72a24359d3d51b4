"""The study's distillation teacher (`train.distill.teacher`) as it is kept: the keys that
configure it, its files, the study's record of the one it trained, and the loaded teacher that
every student of one invocation shares.

A teacher the study trains is stored, once trained, as an MLflow artifact of its trial's run
(`teacher/`: safetensors weights with the model's recipe, and the label names) named by a study
attribute; every worker and every resume loads it from there. A stored teacher
(`runs:/<run id>/teacher`, or a directory holding those files) is used as it is.

Which teacher a study uses is `tuner.trial.teacher_config`; what its students take from it,
`tuner.trial.students`. Workers agree on the trial that trains it through the study's `teacher`
lease (`tuner.study.teacher_trial`).
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import torch
from omegaconf import DictConfig
from optuna.trial import FrozenTrial
from torch import nn

from tuner.data import Encoded
from tuner.deploy import load_weights, read_recipe, save_weights
from tuner.errors import ConfigError, StudyStopped
from tuner.keys import RETRY_HISTORY, STORED_TEACHERS_ATTR, TEACHER_TRIAL_ATTR
from tuner.models import MODEL_FAMILIES, ModelRecipe
from tuner.training import Distillation, TrainResult

KEY = "train.distill.teacher"
ALPHA_KEY = "train.distill.alpha"
START_KEY = "train.distill.start_from"
TEMPERATURE_KEY = "train.distill.temperature"
# The weights a student starts from (`train.distill.start_from`).
START_POINTS = ("pretrained", "teacher")
ARTIFACT_DIR = "teacher"
_WEIGHTS = "teacher.safetensors"
_LABELS = "labels.json"
_ARTIFACT_URI = re.compile(r"^(runs|models|mlflow-artifacts|file|s3|gs|wasbs|hdfs):/")


class TeacherMissing(OSError):
    """The stored teacher is confirmed gone: its run, artifact or files do not exist."""


class TeacherUnreachable(OSError):
    """The stored teacher could not be fetched: nothing says whether it is there."""


# How long a teacher's download is tried again (waits doubling from 1 s) before the worker stops.
FETCH_SECONDS = 60.0


def _downloaded(location: str, tracking_uri: str) -> Path:
    import mlflow
    from mlflow.exceptions import MlflowException

    wait, deadline = 1.0, time.monotonic() + FETCH_SECONDS
    while True:
        try:
            return Path(
                mlflow.artifacts.download_artifacts(
                    artifact_uri=location, tracking_uri=tracking_uri
                )
            )
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST" and _root_visible(
                location, tracking_uri
            ):
                raise TeacherMissing(f"{location}: {exc}") from None
            error: Exception = exc
        except Exception as exc:
            error = exc
        if time.monotonic() + wait > deadline:
            raise TeacherUnreachable(
                f"{location}: {type(error).__name__}: {error} (tried for {FETCH_SECONDS:.0f} s)"
            ) from None
        time.sleep(wait)
        wait *= 2


def _root_visible(location: str, tracking_uri: str) -> bool:
    """Whether a `runs:/` teacher's run could be seen whole from here: a run kept in a local
    directory that this host does not have says nothing about whether the teacher exists."""
    if not location.startswith("runs:/"):
        return True
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    run_id = location.removeprefix("runs:/").split("/", 1)[0]
    try:
        artifact_uri = MlflowClient(tracking_uri).get_run(run_id).info.artifact_uri
    except MlflowException as exc:
        return exc.error_code == "RESOURCE_DOES_NOT_EXIST"  # the run itself is gone
    if artifact_uri.startswith("file:") or "://" not in artifact_uri:
        return Path(artifact_uri.removeprefix("file://").removeprefix("file:")).is_dir()
    return True


@dataclass(frozen=True)
class StoredTeacher:
    """A teacher's files: its weights (with the recipe of its architecture in their metadata)
    and label names."""

    weights: Path
    recipe: ModelRecipe
    label_names: list[str]

    @classmethod
    def load(cls, location: str, tracking_uri: str) -> StoredTeacher:
        """From a local directory, or an MLflow artifact URI. Raises `TeacherMissing` when it is
        confirmed not there (or not a teacher), `TeacherUnreachable` when it could not be asked
        for `FETCH_SECONDS` (a tracking server down, an artifact root this host cannot see).
        The weights are read by `model`."""
        directory = Path(location)
        if _ARTIFACT_URI.match(location):
            directory = _downloaded(location, tracking_uri)
        weights, labels = directory / _WEIGHTS, directory / _LABELS
        if not weights.is_file() or not labels.is_file():
            raise TeacherMissing(f"{location} holds no teacher ({_WEIGHTS} and {_LABELS})")
        return cls(weights, read_recipe(weights), list(json.loads(labels.read_text())))

    def model(self) -> nn.Module:
        return load_weights(self.weights)

    def check_fits(self, model_cfg: DictConfig, label_names: Sequence[str], location: str) -> None:
        """Refuse a teacher that reads other inputs or predicts other labels, naming the key."""
        family = str(model_cfg.family)
        if self.recipe.model.get("family") != family:
            raise ConfigError(
                f"Invalid config: key '{KEY}': the teacher at {location} is a "
                f"{self.recipe.model.get('family')} model, the study's model.family is {family}"
            )
        for key in MODEL_FAMILIES.get(family).input_keys:
            theirs, ours = self.recipe.model.get(key), model_cfg.get(key)
            if theirs != ours:
                raise ConfigError(
                    f"Invalid config: key '{KEY}': the teacher at {location} reads inputs of "
                    f"model.{key}={theirs}, the study's model has model.{key}={ours}"
                )
        if list(self.label_names) != list(label_names):
            raise ConfigError(
                f"Invalid config: key '{KEY}': the teacher at {location} predicts labels "
                f"{self.label_names}, the study's data has {list(label_names)}"
            )


def save_teacher(
    model: nn.Module, recipe: ModelRecipe, label_names: Sequence[str], directory: Path
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_weights(model.eval(), recipe, directory / _WEIGHTS)
    (directory / _LABELS).write_text(json.dumps(list(label_names)))
    return directory


@dataclass(frozen=True)
class TrainedTeacher:
    """A teacher the study trained and stored: the trial that trained it, where it is stored,
    and how it trained (its epochs, time and device, without validation logits; None in a
    record written before tuner kept them)."""

    trial: int
    location: str
    training: TrainResult | None


@dataclass
class Teachers:
    """The study's teacher for one invocation: where it is, and, once loaded, the model and its
    logits of the training set (computed once, shared by every student)."""

    reference: Any
    tracking_uri: str
    label_names: list[str]
    # Set for a teacher the study trains itself: the params its trial trains with.
    params: dict[str, Any] | None = None
    # The teacher's files (fetched once), the loaded teacher and its logits of the training
    # set, each with where they were read from.
    _files: tuple[str, StoredTeacher] | None = field(default=None, repr=False)
    _model: tuple[str, nn.Module] | None = field(default=None, repr=False)
    _logits: tuple[str, torch.Tensor] | None = field(default=None, repr=False)

    def _record(self, stored: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The study attribute's record of a teacher the study trains, once it is stored."""
        if self.params is None:
            return None
        return (stored.get(STORED_TEACHERS_ATTR) or {}).get(str(self.reference))

    def location(self, stored: Mapping[str, Any]) -> str | None:
        """Where the teacher is: the study attribute's record for a trained one."""
        if self.params is None:
            return str(self.reference)
        record = self._record(stored)
        return None if record is None else str(record["uri"])

    def trained(self, stored: Mapping[str, Any]) -> TrainedTeacher | None:
        """For a teacher the study trains, once it is stored: which trial trained it, and how."""
        record = self._record(stored)
        if record is None:
            return None
        training = record.get("training")
        return TrainedTeacher(
            int(record["trial"]),
            str(record["uri"]),
            None if training is None else TrainResult.of_summary(training),
        )

    def _stored_at(self, stored: Mapping[str, Any]) -> str:
        location = self.location(stored)
        if location is None:
            raise StudyStopped(f"no teacher is stored for {KEY}={self.reference}")
        return location

    def files_at(self, location: str) -> StoredTeacher:
        """The teacher's files, fetched once; `TeacherMissing` or `TeacherUnreachable` else."""
        if self._files is None or self._files[0] != location:
            self._files = (location, StoredTeacher.load(location, self.tracking_uri))
        return self._files[1]

    def model(self, stored: Mapping[str, Any]) -> nn.Module:
        """The teacher, loaded once (students must not change it: copy it to start from)."""
        return self.model_at(self._stored_at(stored))

    def model_at(self, location: str) -> nn.Module:
        if self._model is None or self._model[0] != location:
            files = self.files_at(location)
            # Building the architecture before its weights are read draws from the global
            # generator; a trial's training, seeded before, must not depend on whether the
            # teacher was loaded already in this process.
            with torch.random.fork_rng():
                self._model = (location, files.model())
        return self._model[1]

    def distillation(
        self, train_cfg: DictConfig, train_data: Encoded, stored: Mapping[str, Any]
    ) -> Distillation:
        model, location = self.model(stored), str(self.location(stored))
        if self._logits is None or self._logits[0] != location:
            self._logits = (location, Distillation.of(model, 0.0, 1.0, train_data).train_logits)
        distill = train_cfg.distill
        return Distillation(
            model,
            float(distill.alpha),
            float(distill.temperature),
            self._logits[1],
            float(distill.hidden_weight),
        )


def teacher_of(trial: FrozenTrial, by_number: Mapping[int, FrozenTrial]) -> dict[str, Any] | None:
    """A teacher trial's record (reference and params), also for its retries, which carry it
    in the trial they retry."""
    first = by_number.get(int(trial.system_attrs.get(RETRY_HISTORY, [trial.number])[0]), trial)
    return first.system_attrs.get(TEACHER_TRIAL_ATTR)


def record_stored(
    storage: optuna.storages.BaseStorage,
    study_id: int,
    reference: Any,
    trial: int,
    uri: str,
    training: TrainResult,
) -> None:
    """Record where the teacher is stored, which trial trained it and how (its epochs, time
    and device: a retry of that trial loads it and shows the same training)."""
    stored = dict(storage.get_study_user_attrs(study_id).get(STORED_TEACHERS_ATTR) or {})
    stored[str(reference)] = {
        "trial": trial,
        "uri": uri,
        "training": training.summary(),
    }
    storage.set_study_user_attr(study_id, STORED_TEACHERS_ATTR, stored)


def store_after_training(
    model: nn.Module,
    recipe: ModelRecipe,
    label_names: Sequence[str],
    log_artifacts: Callable[[Path], str],
) -> str:
    """Save a trained teacher and log it; returns its artifact URI."""
    with tempfile.TemporaryDirectory(prefix="tuner-teacher-") as workdir:
        return log_artifacts(save_teacher(model, recipe, label_names, Path(workdir) / ARTIFACT_DIR))
