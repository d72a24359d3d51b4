"""A study: start-up checks, experiments and samplers, its preparation and opening, the worker
loop, the teacher's agreement, stale trials and the front's confirmation; and what the report
reads back (the stored study, a point's accuracy on the held-out test split)."""

from __future__ import annotations

from tuner.study.backends import check_backends
from tuner.study.confirmation import Target
from tuner.study.experiments import choose_an_experiment, experiments, help_text
from tuner.study.held_out_accuracy import TEST_METRIC, test_accuracy
from tuner.study.machine_front import (
    machine_counts,
    machine_named,
    publish_machine_front,
)
from tuner.study.measuring import measuring_worker, study_over
from tuner.study.preparation import calibration_inputs, modality_for
from tuner.study.recheck import recheck_front, recheck_note
from tuner.study.run import run_study
from tuner.study.stored_front import study_front
from tuner.study.stored_study import load_study, study_settings

__all__ = [
    "TEST_METRIC",
    "Target",
    "calibration_inputs",
    "check_backends",
    "choose_an_experiment",
    "experiments",
    "help_text",
    "load_study",
    "machine_counts",
    "machine_named",
    "measuring_worker",
    "modality_for",
    "publish_machine_front",
    "recheck_front",
    "recheck_note",
    "run_study",
    "study_front",
    "study_over",
    "study_settings",
    "test_accuracy",
]
