"""Names of everything tuner records: the attributes of Optuna trials and studies, the param key
of the backend, and the tags of MLflow runs. Every module reads and writes them by these names,
so a record can be found from its name here."""

from __future__ import annotations

# --- Optuna trial user attributes ---------------------------------------------------------
# What ties a point to its MLflow run and logged model.
RUN_ID_ATTR = "mlflow_run_id"
MODEL_URI_ATTR = "mlflow_model_uri"
# Set on every trial tuner fails (a failed point or trial), with why; a failed trial without
# it was failed by Optuna: its worker died or was interrupted.
FAIL_REASON_ATTR = "fail_reason"
# Set on a failed trial whose model trained but whose backend failed: a failed point.
FAILED_BACKEND_ATTR = "failed_backend"
# The digest of a point's latency key in the study's latency table (`tuner.store.latency_table`).
LATENCY_KEY_ATTR = "latency_key"
# Every trial, before it trains: backend -> the digest of its latency key (null for a backend
# whose graph follows the trained weights), for measuring workers to find (`tuner.measure`).
LATENCY_KEYS_ATTR = "latency_keys"
# Set on every point of a study's distillation teacher: the `train.distill.teacher` reference
# it was trained for. The teacher trains with fixed values, not sampled params, so its points
# show this in their params.
TEACHER_OF_ATTR = "distill_teacher_of"
# The trial whose model a point deploys.
TRAINED_IN_ATTR = "trained_in_trial"
SKIPPED_ATTR = "skipped"
# The configuration a point belongs to (`budget.configuration_of`).
CONFIGURATION_ATTR = "configuration"
# The width and depth of the model a point deployed (`model.ffn_width`: 1024,
# `model.num_layers`: 4), whether typed, resolved from a fraction or the model's own.
ARCHITECTURE_ATTR = "architecture"
# Per attention layer, which of its original heads a trial's model kept (`model.num_heads`,
# chosen on training batches); set only where heads were pruned. The tag holds it as JSON on the
# trial's run.
KEPT_HEADS_ATTR = "kept_heads"
KEPT_HEADS_TAG = "tuner.kept_heads"
# The eager fp32 validation accuracy of the model a point was deployed from.
EAGER_ACCURACY_ATTR = "reference_accuracy"
# Where a point's time goes: its profile by op class and its roofline.
INSIGHT_ATTR = "insight"
# The fingerprint of the data settings a point was trained and validated on
# (`data_fingerprint`).
DATA_SETTINGS_ATTR = "data_settings"
# Every trial that trains: its eager validation accuracy per epoch.
CURVE_ATTR = "val_accuracy_curve"
# A pruned trial: why it was stopped, and what the sampler is shown (`values`: accuracy and
# latency, `constraints`: name -> value).
PRUNED_ATTR = "pruned_reason"
SAMPLER_VIEW_ATTR = "sampler_view"

# --- Optuna trial params and system attributes ---------------------------------------------
# Every listed backend is deployed, so the backend is no part of a configuration: a trial
# records the one whose point it carries, and a retry decides that again.
BACKEND_KEY = "deploy.backend"
# A teacher trial: the reference it trains and the params it trains with.
TEACHER_TRIAL_ATTR = "tuner:teacher"
# A teacher trial that an earlier version of tuner finished unrun (another worker had queued one
# at the same moment). Read for studies made then: never counted.
DUPLICATE_ATTR = "tuner:teacher_duplicate"
# Optuna's heartbeat retry records the numbers a trial retries under this attribute; tuner's own
# retries (after Ctrl-C or SIGTERM) use the same one.
RETRY_HISTORY = "retry_history"

# --- Optuna study user attributes ----------------------------------------------------------
# The settings the study was made with, and the changes recorded since (`tuner.store.settings`).
SETTINGS_ATTR = "settings"
CHANGES_ATTR = "settings_changes"
# The hypervolume's reference point (accuracy, latency ms), fixed once per study so that its
# hypervolume curve stays comparable (`tuner.front.convergence`).
REFERENCE_ATTR = "hypervolume_reference"
# Teacher reference (`auto`, a trial number) -> where it is stored.
STORED_TEACHERS_ATTR = "teachers"
# The peaks measured on one machine (its digest follows the prefix).
PEAK_ATTR_PREFIX = "machine_peak:"
# A machine latencies are measured on, by its `deploy.machine` name (`tuner.store.machines`).
MACHINE_ATTR_PREFIX = "machine:"

# --- MLflow run artifacts ------------------------------------------------------------------
# Beside a point's logged model: the label it predicted for each validation example when it was
# deployed, against which another machine re-checks the model (`python -m tuner.measure`).
PREDICTIONS_ARTIFACT = "deploy/val_predictions.json"

# --- MLflow run tags -----------------------------------------------------------------------
# What a run is: `study` (the parent run) or `trial` (a trial's, or a point's).
ROLE_TAG = "tuner.role"
# The trial whose model a point's run deploys.
TRAINED_IN_TAG = "tuner.trained_in_trial"
# Where a point's logged model is, and why a point on the front has none.
MODEL_URI_TAG = "tuner.model_uri"
MODEL_ABSENT_TAG = "tuner.model_absent"
MODEL_ERROR_TAG = "tuner.model_error"
# The command that retrains a point.
RETRAIN_TAG = "tuner.retrain"
# The stored teacher a student learnt from, and what it started from (`train.distill.start_from`).
TEACHER_TAG = "tuner.teacher"
START_FROM_TAG = "tuner.start_from"
# Where a stored teacher was loaded from, instead of trained again.
TEACHER_LOADED_TAG = "tuner.teacher_loaded"
# Set on the run of a trial that early stopping pruned.
PRUNED_TAG = "tuner.pruned"
# Beside the report's test accuracy of a point: how many test examples it was measured on, and
# the data fingerprint of that split, so that a value measured on another split is never reused.
TEST_EXAMPLES_TAG = "tuner.test_examples"
TEST_SPLIT_TAG = "tuner.test_split"
# Set on a front point's run by a measuring worker (its machine's name follows the prefix):
# whether its logged model, run there, changed more of its validation predictions than
# `deploy.agreement_tolerance` allows.
DISAGREES_TAG_PREFIX = "tuner.disagrees."
