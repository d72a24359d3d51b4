"""MLflow: the study's parent run, a run per trial and per point, the command that retrains a
point."""

from __future__ import annotations

from tuner.tracking.retrain import override_keys, retrain_command, retrain_overrides
from tuner.tracking.runs import MODEL_ABSENT_TAG, MODEL_ERROR_TAG, MODEL_URI_TAG, Tracker

__all__ = [
    "MODEL_ABSENT_TAG",
    "MODEL_ERROR_TAG",
    "MODEL_URI_TAG",
    "Tracker",
    "override_keys",
    "retrain_command",
    "retrain_overrides",
]
