"""Which teacher the study uses (`train.distill.teacher`), checked before anything trains.

`auto` is the unedited model trained with the experiment's own values of the searched keys; a
trial number is that trial's configuration trained again. Either teacher is trained in a trial
of the study (so it is also a point of the front) before any student. Anything else names a
stored teacher (`runs:/<run id>/teacher`, or a directory), used as it is once it fits the
study's model and labels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf
from optuna.trial import FrozenTrial, TrialState

from tuner.config import SearchSpace
from tuner.errors import ConfigError
from tuner.keys import BACKEND_KEY
from tuner.models import MODEL_FAMILIES
from tuner.trial.students import (
    check_start_from,
    distilling,
    model_edit_keys,
    starts_from_teacher_anywhere,
)
from tuner.trial.teacher import ALPHA_KEY, KEY, START_KEY, StoredTeacher, Teachers


def is_trained_in_study(reference: Any) -> bool:
    """`auto` or a trial number: a teacher the study trains itself."""
    return reference == "auto" or _trial_number(reference) is not None


def _trial_number(reference: Any) -> int | None:
    if isinstance(reference, bool):
        return None
    if isinstance(reference, int):
        return reference
    return int(reference) if isinstance(reference, str) and reference.isdigit() else None


def teacher_params(
    cfg: DictConfig, space: SearchSpace, reference: Any, trials: Sequence[FrozenTrial]
) -> dict[str, Any]:
    """The values a teacher trial trains with: every searched key (the backend aside) at the
    experiment's own value, structural edits off (`auto`), or a trial's configuration; never
    distilled itself, and started from the model's own weights."""
    number = _trial_number(reference)
    if number is None:
        edited = model_edit_keys()
        params = {
            key: None if key in edited else OmegaConf.select(cfg, key)
            for key in space.distributions
            if key != BACKEND_KEY
        }
        params.update({key: None for key in edited if OmegaConf.select(cfg, key) is not None})
    else:
        chosen = next((t for t in trials if t.number == number), None)
        if chosen is None or chosen.state != TrialState.COMPLETE:
            state = "does not exist" if chosen is None else f"is {chosen.state.name}"
            raise ConfigError(
                f"Invalid config: key '{KEY}': trial #{number} {state}; name a complete trial "
                "of this study, auto, or a stored teacher (runs:/<run id>/teacher or a directory)"
            )
        params = {k: v for k, v in chosen.params.items() if k != BACKEND_KEY}
    return {**params, ALPHA_KEY: 0.0, START_KEY: "pretrained"}


def teachers_for(
    cfg: DictConfig,
    space: SearchSpace,
    label_names: Sequence[str],
    trials: Sequence[FrozenTrial],
    study_attrs: Mapping[str, Any],
) -> Teachers | None:
    """The study's teacher, checked before anything trains; None when nothing distils."""
    if not distilling(cfg, space):
        return None
    family = MODEL_FAMILIES.get(str(cfg.model.family))
    if float(cfg.train.distill.hidden_weight) > 0 and not family.layer_stack:
        raise ConfigError(
            f"Invalid config: key 'train.distill.hidden_weight': {cfg.model.family} models have "
            "no stack of transformer layers whose hidden states a student could learn; set it "
            "to 0 (logits distillation works for every model)"
        )
    reference = cfg.train.distill.teacher
    uri = str(cfg.tracking.uri)
    if is_trained_in_study(reference):
        params = teacher_params(cfg, space, reference, trials)
        teachers = Teachers(reference, uri, list(label_names), params)
        if starts_from_teacher_anywhere(cfg, space):
            teacher_model = _architecture(cfg, params, teachers, study_attrs)
            check_start_from(cfg, space, teacher_model, f"{KEY}={reference}", len(label_names))
        return teachers
    location = str(reference)
    try:
        stored = StoredTeacher.load(location, uri)
    except OSError as exc:
        raise ConfigError(f"Invalid config: key '{KEY}': {exc}") from None
    stored.check_fits(cfg.model, label_names, location)
    if starts_from_teacher_anywhere(cfg, space):
        check_start_from(
            cfg, space, stored.recipe.model, f"the teacher at {location}", len(label_names)
        )
    try:
        stored.model()
    except Exception as exc:  # weights that do not fill the recipe's architecture
        raise ConfigError(
            f"Invalid config: key '{KEY}': the teacher at {location} cannot be loaded: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    return Teachers(location, uri, list(label_names))


def _architecture(
    cfg: DictConfig, params: Mapping[str, Any], teachers: Teachers, study_attrs: Mapping[str, Any]
) -> Mapping[str, Any]:
    """The `model` config of a teacher the study trains: as stored, once it is (a resume with
    other model settings must not start students from a model it no longer describes); else
    the study's with the teacher's params."""
    location = teachers.location(study_attrs)
    if location is not None:
        try:
            return teachers.files_at(location).recipe.model
        except OSError:  # gone or out of reach: `tuner.study.teacher_trial` decides which
            pass
    model = OmegaConf.to_container(cfg.model, resolve=True)
    assert isinstance(model, dict)
    model.update({k[len("model.") :]: v for k, v in params.items() if k.startswith("model.")})
    return model
