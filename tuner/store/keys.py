"""Names of what tuner records on Optuna trials and studies: user and system attributes, and
the param key of the backend. Every module reads and writes them through these names."""

from __future__ import annotations

# Optuna user attributes that tie a point to its MLflow run and logged model.
RUN_ID_ATTR = "mlflow_run_id"
MODEL_URI_ATTR = "mlflow_model_uri"
# Set on every trial tuner fails (a failed point or trial), with why; a failed trial without
# it was failed by Optuna: its worker died or was interrupted.
FAIL_REASON_ATTR = "fail_reason"
# Set on a failed trial whose model trained but whose backend failed: a failed point.
FAILED_BACKEND_ATTR = "failed_backend"
# The digest of a point's latency key in the study's latency table (`tuner.store.latency_table`).
LATENCY_KEY_ATTR = "latency_key"
# Set on every point of a study's distillation teacher: the `train.distill.teacher` reference
# it was trained for. The teacher trains with fixed values, not sampled params, so its points
# show this in their params.
TEACHER_OF_ATTR = "distill_teacher_of"
TRAINED_IN_ATTR = "trained_in_trial"
# Every listed backend is deployed, so the backend is no part of a configuration: a trial
# records the one whose point it carries, and a retry decides that again.
BACKEND_KEY = "deploy.backend"
SKIPPED_ATTR = "skipped"
# System attribute of a teacher trial that an earlier version of tuner finished unrun (another
# worker had queued one at the same moment). Read for studies made then: never counted.
DUPLICATE_ATTR = "tuner:teacher_duplicate"
# Optuna's heartbeat retry records the numbers a trial retries under this system attribute;
# tuner's own retries (after Ctrl-C or SIGTERM) use the same one.
RETRY_HISTORY = "retry_history"
