"""The trial that trains the study's teacher, agreed on by every worker.

The teacher is trained in one ordinary trial of the study, queued WAITING under the study's
`teacher` lease by the first worker that finds neither a stored teacher nor a live attempt: the
others see it and queue nothing. The storage lets one worker move it to RUNNING; the others wait
for the stored record. A worker that dies while training it stops beating, and the trial is
failed and queued again like any other (`tuner.recovery`); a retry that finds the teacher stored
loads it rather than train another. A teacher whose files are confirmed gone is forgotten and
trained again, once, by the worker that finds it so first.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import StudyStopped
from tuner.interrupts import raise_if_interrupted
from tuner.keys import FAIL_REASON_ATTR, SKIPPED_ATTR, STORED_TEACHERS_ATTR, TEACHER_TRIAL_ATTR
from tuner.store import (
    Leases,
    budget,
    died,
    requeue,
    storage_of,
    study_id_of,
    trial_id_of,
)
from tuner.study import messages
from tuner.study.worker_loop import carry_on
from tuner.trial import KEY, TeacherMissing, Teachers, TeacherUnreachable, teacher_of
from tuner.trial import messages as trial_messages

# (the claimed teacher trial) -> None: runs the objective on it and tells the study.
RunTrial = Callable[[FrozenTrial], None]


def ensure_trained(
    study: optuna.Study,
    leases: Leases,
    teachers: Teachers | None,
    run_trial: RunTrial,
    poll_seconds: float,
    max_retry: int,
) -> None:
    """Return once the study's teacher is stored: train it in the trial this worker claims, or
    wait while another worker trains it. An attempt that fails for a reason while this runs
    stops the study with it; one whose worker died is queued again. A database lost on the way
    is waited for (`tuner.study.worker_loop.carry_on`)."""
    if teachers is None or teachers.params is None:
        return
    while True:
        try:
            return _ensure_trained(study, leases, teachers, run_trial, poll_seconds, max_retry)
        except StudyStopped:
            raise
        except Exception as error:
            if not carry_on(study, error):
                raise


def _ensure_trained(
    study: optuna.Study,
    leases: Leases,
    teachers: Teachers,
    run_trial: RunTrial,
    poll_seconds: float,
    max_retry: int,
) -> None:
    """`ensure_trained` until an error that the caller decides to wait out or not."""
    storage, study_id = storage_of(study), study_id_of(study)
    reference = str(teachers.reference)
    # Attempts that failed before this invocation are the user's to fix: they start a new one.
    started_with = len(storage.get_all_trials(study_id, deepcopy=False))
    told_waiting = retrained = False
    while True:
        raise_if_interrupted()
        location = teachers.location(storage.get_study_user_attrs(study_id))
        if location is not None:
            if _stored_teacher_fetched(leases, storage, study_id, teachers, location, retrained):
                return
            retrained = True
            continue
        latest = _latest_attempt(storage, study_id, reference)
        if (
            latest is None
            or latest.state == TrialState.COMPLETE
            or (latest.state.is_finished() and latest.number < started_with)
        ):
            # None yet, or one that stored a teacher since forgotten, or one that failed before.
            _queue_attempt(leases, storage, study_id, teachers, latest)
        elif latest.state == TrialState.WAITING:
            # False where another worker claimed it first. Claimed with its first heartbeat:
            # should this worker die before it beats, the trial goes stale.
            if storage.set_trial_state_values(trial_id_of(latest), TrialState.RUNNING):
                messages.training_teacher(latest.number, teachers.reference)
                run_trial(storage.get_trial(trial_id_of(latest)))
        elif latest.state == TrialState.RUNNING:
            if not told_waiting:
                messages.waiting_for_teacher(latest.number)
                told_waiting = True
            optuna.storages.fail_stale_trials(study)
            time.sleep(poll_seconds)
        elif died(latest) and requeue(leases, storage, study_id, latest, max_retry):
            continue  # queued again (by this worker, or by the one that found it stale)
        else:
            attrs = latest.user_attrs
            reason = (
                attrs.get(FAIL_REASON_ATTR)
                or attrs.get(SKIPPED_ATTR)
                or (f"its worker died {max_retry + 1} times" if died(latest) else latest.state.name)
            )
            raise StudyStopped(
                f"the distillation teacher ({KEY}={teachers.reference}, trial "
                f"#{latest.number}) did not train: {reason}. No student was trained; "
                "fix the cause and run the same command to resume"
            )


def _stored_teacher_fetched(
    leases: Leases,
    storage: optuna.storages.BaseStorage,
    study_id: int,
    teachers: Teachers,
    location: str,
    retrained: bool,
) -> bool:
    """True once the teacher stored at `location` is fetched. Files confirmed gone are said and
    a new attempt is queued (False); a teacher that cannot be reached, or that is gone again
    once `retrained`, stops the study."""
    try:
        # Fetched once for the whole invocation: the students read the same files.
        teachers.files_at(location)
        return True
    except TeacherUnreachable as exc:
        raise StudyStopped(
            f"the study's stored teacher cannot be fetched ({exc}); it is not trained "
            "again while nothing says it is gone. Make its artifacts reachable from "
            "this host (an MLflow server serving artifacts) and run the same command"
        ) from None
    except TeacherMissing as exc:
        if retrained:
            raise StudyStopped(f"the teacher trained again cannot be found: {exc}") from None
        trial_messages.teacher_missing(location, str(exc))
        seen = _latest_attempt(storage, study_id, str(teachers.reference))
        _queue_attempt(leases, storage, study_id, teachers, seen, gone=location)
        return False


def _latest_attempt(
    storage: optuna.storages.BaseStorage, study_id: int, reference: str
) -> FrozenTrial | None:
    """The study's latest trial that trains the teacher `reference` (a retry included).
    Attempts follow one another: a new one is queued only once none is live."""
    trials = storage.get_all_trials(study_id, deepcopy=False)  # in the order of their numbers
    by_number = {t.number: t for t in trials}
    attempts = [
        t
        for t in trials
        # A teacher trial finished unrun by an earlier version of tuner is no attempt.
        if budget.is_configuration(t)
        and (teacher_of(t, by_number) or {}).get("reference") == reference
    ]
    return attempts[-1] if attempts else None


def _queue_attempt(
    leases: Leases,
    storage: optuna.storages.BaseStorage,
    study_id: int,
    teachers: Teachers,
    seen: FrozenTrial | None,
    gone: str | None = None,
) -> None:
    """Queue a teacher trial, unless another worker stored the teacher or queued one since this
    worker looked (`seen` was the latest attempt then). With `gone`, the record of the teacher
    stored there is dropped first (unless another worker did so, and perhaps stored another)."""
    reference = str(teachers.reference)
    with leases.hold("teacher"):
        stored = dict(storage.get_study_user_attrs(study_id).get(STORED_TEACHERS_ATTR) or {})
        # Stored (with `gone`: another worker dropped it first, and queued its new attempt).
        if (stored.get(reference) or {}).get("uri") != gone:
            return
        if gone is not None:
            stored.pop(reference)
            storage.set_study_user_attr(study_id, STORED_TEACHERS_ATTR, stored)
        latest = _latest_attempt(storage, study_id, reference)
        if (latest and latest.number) != (seen and seen.number):
            return
        template = optuna.trial.create_trial(
            state=TrialState.WAITING,
            system_attrs={TEACHER_TRIAL_ATTR: {"reference": reference, "params": teachers.params}},
        )
        storage.create_new_trial(study_id, template_trial=template)
