"""One trial: build, train and deploy a configuration, time it before training, record its
points, load the study's teacher."""

from __future__ import annotations

from tuner.trial.context import ServingContext, TrialContext
from tuner.trial.model_factory import ModelFactory, untrained_model
from tuner.trial.objective import Objective
from tuner.trial.teacher import (
    KEY,
    START_POINTS,
    TeacherMissing,
    Teachers,
    TeacherUnreachable,
    teacher_of,
)
from tuner.trial.teacher_config import teachers_for

__all__ = [
    "KEY",
    "ModelFactory",
    "Objective",
    "START_POINTS",
    "ServingContext",
    "TeacherMissing",
    "TeacherUnreachable",
    "Teachers",
    "TrialContext",
    "teacher_of",
    "teachers_for",
    "untrained_model",
]
