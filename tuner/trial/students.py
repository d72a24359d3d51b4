"""How the study's students relate to its teacher: whether any trial learns from one
(`train.distill.alpha`; a trial at alpha 0 has no teacher), whether a student starts from its
weights (`train.distill.start_from`) and the student it then is, cut to its own size, and the
checks, before anything trains, that every student the space can sample can start from them."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from tuner.config import SearchSpace, candidate_values
from tuner.edits import apply_edits, edit_keys
from tuner.errors import ConfigError
from tuner.models import MODEL_FAMILIES
from tuner.trial.teacher import ALPHA_KEY, KEY, START_KEY


def _candidates(cfg: DictConfig, space: SearchSpace, key: str) -> list[Any]:
    """The values `key` takes in the study: those searched, or the config's own."""
    searched = space.distributions.get(key)
    return candidate_values(searched) if searched else [OmegaConf.select(cfg, key)]


def distilling(cfg: DictConfig, space: SearchSpace) -> bool:
    """Whether any trial of the study can learn from a teacher."""
    return any(float(alpha) > 0 for alpha in _candidates(cfg, space, ALPHA_KEY))


def starts_from_teacher(train_cfg: DictConfig) -> bool:
    """Whether a trial of `train_cfg` starts from the teacher's weights: only one that learns
    from it (alpha 0 is no teacher at all)."""
    return float(train_cfg.distill.alpha) > 0 and train_cfg.distill.start_from == "teacher"


def student_of(
    teacher: nn.Module,
    model_cfg: DictConfig,
    build: Callable[[], nn.Module],
    inputs: Sequence[tuple[torch.Tensor, ...]] | None = None,
) -> nn.Module:
    """A student that starts from the teacher's weights, the teacher left as it is: a copy of
    it, or, in a family whose size keys build smaller architectures, the student's own
    (`build`) filled with them; its structural edits applied either way, those that measure
    what to keep measuring the teacher's weights on `inputs` (the teacher's heads are pruned).
    Every layer, the head included, was trained on this task, so none is initialised anew."""
    inherit = MODEL_FAMILIES.get(str(model_cfg.family)).inherit
    if inherit is None:
        student = copy.deepcopy(teacher)
    else:
        student = build()
        inherit(teacher, student)
    apply_edits(student, model_cfg, inputs)
    return student


def model_edit_keys() -> set[str]:
    """The config keys of the structural edits (`model.<key>`)."""
    return {f"model.{key}" for key in edit_keys()}


def starts_from_teacher_anywhere(cfg: DictConfig, space: SearchSpace) -> bool:
    """Whether any trial of the study can start from the teacher's weights."""
    return "teacher" in _candidates(cfg, space, START_KEY)


def check_start_from(
    cfg: DictConfig,
    space: SearchSpace,
    teacher_model: Mapping[str, Any],
    teacher: str,
    num_labels: int,
) -> None:
    """Students that start from the teacher's weights take them at their own size: refuse a
    teacher that is already edited, whose architecture differs from the study's in anything but
    the students' structural edits and size keys (searched or fixed), or that a student of the
    study would not fit into, naming the key."""
    family = MODEL_FAMILIES.get(str(cfg.model.family))
    shaping = model_edit_keys() | {f"model.{key}" for key in family.size_keys}
    why = (
        f"Invalid config: key '{START_KEY}': teacher: students start from the teacher's weights "
        "at their own size"
    )
    built = [k for k in space.distributions if k.startswith("model.") and k not in shaping]
    if built:
        sizes = [k for k in sorted(shaping) if k[len("model.") :] in cfg.model]
        raise ConfigError(
            f"{why}, and the space searches {built[0]}, which does not size a model (a student "
            f"taken from the teacher could not follow it); search only "
            f"{', '.join(sizes) or 'no model keys'}, or start from pretrained"
        )
    for key in sorted(model_edit_keys()):
        value = teacher_model.get(key[len("model.") :])
        if value is not None:
            raise ConfigError(
                f"{why}, and {teacher} is already edited ({key}={value}); use an unedited "
                f"teacher ({KEY}=auto) or start from pretrained"
            )
    ours = OmegaConf.to_container(cfg.model, resolve=True)
    assert isinstance(ours, dict)
    for name, value in ours.items():
        if f"model.{name}" not in shaping and teacher_model.get(name) != value:
            raise ConfigError(
                f"{why}, and {teacher} has model.{name}={teacher_model.get(name)}, the study's "
                f"model has model.{name}={value}"
            )
    if family.inherit is not None:
        _check_students_fit(cfg, space, teacher_model, num_labels, f"{why}, and {teacher}")


def _check_students_fit(
    cfg: DictConfig,
    space: SearchSpace,
    teacher_model: Mapping[str, Any],
    num_labels: int,
    refusal: str,
) -> None:
    """Fill a student of every candidate size with an untrained teacher's weights, as a trial
    would with the trained one: a student larger than the teacher is refused before training."""
    family = MODEL_FAMILIES.get(str(cfg.model.family))
    keys = [f"model.{key}" for key in family.size_keys]
    # Building models draws from the global generator, which must not move before training.
    with torch.random.fork_rng(devices=[]):
        teacher = family.build(OmegaConf.create(dict(teacher_model)), num_labels)
        for sizes in itertools.product(*(_candidates(cfg, space, key) for key in keys)):
            student_cfg = cfg.model.copy()
            for key, value in zip(keys, sizes, strict=True):
                student_cfg[key[len("model.") :]] = value
            try:
                family.inherit(teacher, family.build(student_cfg, num_labels))
            except ValueError as exc:
                size = ", ".join(f"{key}={value}" for key, value in zip(keys, sizes, strict=True))
                raise ConfigError(f"{refusal} does not fit a student of {size}: {exc}") from None
