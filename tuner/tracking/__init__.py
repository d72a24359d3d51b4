"""MLflow: the study's parent run, a run per trial and per point, the command that retrains a
point."""

from __future__ import annotations

from tuner.tracking.retrain import override_keys, retrain_command, retrain_overrides
from tuner.tracking.runs import Tracker, set_run_tags

__all__ = [
    "Tracker",
    "override_keys",
    "retrain_command",
    "retrain_overrides",
    "set_run_tags",
]
