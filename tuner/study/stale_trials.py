"""A trial whose worker stopped: queue it again, and close what the worker left open in MLflow.

Two ways in: the heartbeat callback, run by whichever live worker notices a silent trial
(SIGKILL, a lost machine), and the interrupt path of the worker itself (Ctrl-C, SIGTERM). Either
way the trial stays FAIL, its MLflow runs say why, and a copy with the same params waits in the
study for the next worker (or the next run of the same command); `study.n_trials` counts the
copy instead.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial

from tuner.store import (
    Leases,
    died,
    requeue,
    retried_numbers,
    storage_of,
    study_id_of,
)
from tuner.study import messages
from tuner.tracking import Tracker


class StaleTrials:
    """Optuna's heartbeat-stale callback: runs in a live worker when another one went silent."""

    def __init__(self, leases: Leases, tracker: Tracker, max_retry: int, grace_period: int) -> None:
        self.leases = leases
        self.tracker = tracker
        self.max_retry = max_retry
        self.grace_period = grace_period

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        try:
            queued = requeue(
                self.leases, storage_of(study), study_id_of(study), trial, self.max_retry
            )
            outcome = "queued again with the same params" if queued else "retries exhausted"
        except Exception as exc:  # `requeue_orphans` queues it on a later look
            outcome = f"not queued yet ({type(exc).__name__}: {exc}); it is on a later look"
        reason = f"its worker sent no heartbeat for {self.grace_period} s (killed or lost); "
        reason += outcome
        self.tracker.close_abandoned(study.study_name, trial.number, reason)
        messages.stale_trial(trial.number, reason)


def requeue_orphans(
    leases: Leases, storage: optuna.storages.BaseStorage, study_id: int, max_retry: int
) -> None:
    """Queue every configuration whose trial failed without a reason of tuner's own (its worker
    died or was interrupted) and has no retry: the worker that failed it died, or lost the
    database, before queueing it."""
    trials = storage.get_all_trials(study_id, deepcopy=False)
    retried = retried_numbers(trials)
    for trial in trials:
        if died(trial) and trial.number not in retried:
            requeue(leases, storage, study_id, trial, max_retry)
