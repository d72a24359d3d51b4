"""A study: start-up checks, experiments and samplers, the worker loop, the teacher's
agreement, stale trials and the front's confirmation."""

from __future__ import annotations

from tuner.study.confirmation import Target
from tuner.study.experiments import choose_an_experiment, experiments, help_text
from tuner.study.run import calibration_inputs, check_backends, modality_for, run_study
from tuner.study.stored_front import study_front

__all__ = [
    "Target",
    "calibration_inputs",
    "check_backends",
    "choose_an_experiment",
    "experiments",
    "help_text",
    "modality_for",
    "run_study",
    "study_front",
]
