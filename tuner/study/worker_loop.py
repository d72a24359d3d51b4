"""A worker's loop over a study's trials: run them until the budget is met, then stay while
other workers' trials run, taking any that is queued again.

A database outage is ridden out: calls that are safe to repeat are retried by the storage
(`tuner.store.storage`); a write that failed ends `study.optimize`, and the worker waits for the
database (`RETRY_SECONDS`) and goes on. What that write may have left (a trial created but never
started) is found stale and queued again. A trial that another worker failed as stale while
this one still ran it (an outage longer than the heartbeat's grace period) is left to its retry.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner import console
from tuner.interrupts import deferred, raise_if_interrupted
from tuner.store import (
    RETRY_SECONDS,
    budget,
    call_with_retries,
    error_line,
    heartbeat_of,
    is_heartbeat_enabled,
    is_transient,
    storage_of,
    trial_id_of,
)
from tuner.study import messages

Objective = Callable[[optuna.Trial], tuple[float, float]]
# Runs of `study.optimize` in a row that a lost database may end before the worker stops.
_LOST_AT_MOST = 10
Publish = Callable[[optuna.Study, FrozenTrial], None]


def nothing_left(study: optuna.Study, n_trials: int) -> bool:
    trials = study.get_trials(deepcopy=False)
    unfinished = (TrialState.RUNNING, TrialState.WAITING)
    return budget.trained(trials) >= n_trials and not any(t.state in unfinished for t in trials)


def run_to_budget(
    study: optuna.Study,
    objective: Objective,
    publish: Publish,
    n_trials: int,
    poll_seconds: int,
    requeue_orphans: Callable[[], None],
) -> None:
    """Run trials until the study holds `n_trials` trained configurations (see
    `tuner.store.budget`), then stay while other workers' trials run: if one of them dies, its
    heartbeat lapses, it is queued again, and this worker takes it."""
    told = False
    lost = 0
    while True:
        requeue_orphans()
        trials = study.get_trials(deepcopy=False)
        waiting = any(t.state == TrialState.WAITING for t in trials)
        if waiting or budget.trained(trials) < n_trials:
            # A failing trial is recorded with its reason; the study goes on. Interrupts wait
            # while Optuna creates or closes a trial; the objective takes them at once while it
            # trains.
            try:
                with deferred():
                    study.optimize(objective, catch=(Exception,), callbacks=[publish])
                lost = 0
            except Exception as error:
                # A database that answers reads but fails every write is not coming back.
                lost += 1
                if lost > _LOST_AT_MOST or not carry_on(study, error):
                    raise
            # One that waited while the last trial was closed.
            raise_if_interrupted()
            continue
        optuna.storages.fail_stale_trials(study)
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            continue
        # Without heartbeats a dead worker's trial would be waited for forever.
        if not running or not is_heartbeat_enabled(storage_of(study)):
            return
        if not told:
            messages.waiting_for_workers(len(running))
            told = True
        time.sleep(poll_seconds)


def carry_on(study: optuna.Study, error: Exception) -> bool:
    """Whether the worker goes on after `error` ended a trial's run: a trial another worker
    failed as stale meanwhile (it is queued again), or a database lost mid-call, once it
    answers again (raising if it does not within `RETRY_SECONDS`)."""
    if taken(error):
        console.console.print(
            f"  [yellow]this worker's trial was failed by another worker that found it silent "
            f"({error}); that worker queued it again, unless its retries were used up[/]"
        )
        return True
    if not is_transient(error):
        return False
    console.console.print(
        f"  [yellow]the database was lost mid-call ({error_line(error)}); waiting for it to "
        "answer, then going on (a trial the call left half-made is found stale and queued "
        "again)[/]"
    )
    time.sleep(1.0)
    call_with_retries(study.get_trials, deepcopy=False, seconds=RETRY_SECONDS)
    return True


def taken(error: BaseException | None) -> bool:
    """Telling the study a trial that another worker already failed as stale, in Optuna's
    words; Optuna may raise something else while handling it, so its context counts too."""
    while error is not None:
        if isinstance(error, ValueError) and str(error).startswith("Cannot tell a FAIL trial"):
            return True
        if isinstance(error, optuna.exceptions.UpdateFinishedTrialError):
            return True
        error = error.__cause__ or error.__context__
    return False


def claimed_trial_runner(
    study: optuna.Study,
    objective: Objective,
    record_front: Callable[[optuna.Study], None],
) -> Callable[[FrozenTrial], None]:
    """Runs the objective on a trial this worker claimed outside `study.optimize` (the
    teacher's), as `study.optimize` runs its own: beating while it runs, told its outcome, the
    front published after it."""
    storage = storage_of(study)

    def run(claimed: FrozenTrial) -> None:
        trial_id = trial_id_of(claimed)
        trial = optuna.Trial(study, trial_id)
        values, state = None, TrialState.COMPLETE
        with heartbeat_of(trial_id, storage):
            try:
                values = objective(trial)
            except optuna.TrialPruned:
                state = TrialState.PRUNED
            except Exception:  # recorded with its reason by the objective
                state = TrialState.FAIL
            except BaseException:
                with deferred():
                    study.tell(trial, state=TrialState.FAIL)
                raise
        try:
            with deferred():
                study.tell(trial, values, state=state)
        except Exception as error:
            if not carry_on(study, error):
                raise
        record_front(study)
        raise_if_interrupted()

    return run
