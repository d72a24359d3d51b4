"""Queue a configuration again once its trial's worker stopped (died, was interrupted, or lost
the database): once however many workers ask, never beyond its retries."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial

from tuner.keys import FAIL_REASON_ATTR, RETRY_HISTORY
from tuner.store.budget import is_configuration, retried_numbers, retry_template
from tuner.store.lease import Leases


def requeue(
    leases: Leases,
    storage: optuna.storages.BaseStorage,
    study_id: int,
    trial: FrozenTrial,
    max_retry: int,
) -> bool:
    """Queue a copy of `trial` with its params, once however many workers ask; False once it
    has been retried `max_retry` times (it then stays failed, and counts)."""
    # Only configurations are trained: not another backend's point of a model, nor a teacher
    # trial that an earlier version of tuner finished unrun.
    if len(trial.system_attrs.get(RETRY_HISTORY, [])) >= max_retry or not is_configuration(trial):
        return False
    with leases.hold("requeue"):
        if trial.number not in retried_numbers(storage.get_all_trials(study_id, deepcopy=False)):
            storage.create_new_trial(study_id, template_trial=retry_template(trial))
    return True


def died(trial: FrozenTrial) -> bool:
    """Failed without a reason of tuner's own: its worker was found dead, or interrupted."""
    return trial.state == optuna.trial.TrialState.FAIL and FAIL_REASON_ATTR not in trial.user_attrs
