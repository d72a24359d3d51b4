"""`study.n_trials` as the study's total of trained configurations, across every worker.

Trial numbers are handed out atomically by the storage, so each worker decides alone and all
agree: trial k trains only while fewer than `n_trials` counted trials have a smaller number. A
trial counts when it trained, or is training, a configuration. These do not count: another
backend's point of a model (it was not trained), a trial whose worker died or was interrupted
(a retry with the same params is queued and counts instead), a trial skipped because the
budget was already full, and a duplicate of the study's teacher trial.
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.keys import BACKEND_KEY, DUPLICATE_ATTR, RETRY_HISTORY, SKIPPED_ATTR, TRAINED_IN_ATTR


def is_configuration(trial: FrozenTrial) -> bool:
    """A trial that trained (or trains) a configuration: not another backend's point of it,
    nor a duplicate teacher trial."""
    if DUPLICATE_ATTR in trial.system_attrs:
        return False
    return trial.user_attrs.get(TRAINED_IN_ATTR, trial.number) == trial.number


def configuration_of(trial: FrozenTrial) -> int:
    """The first trial of a configuration: its retries (after an interrupt or a dead worker)
    train the same params again and complete its points."""
    return int(trial.system_attrs.get(RETRY_HISTORY, [trial.number])[0])


def retried_numbers(trials: Sequence[FrozenTrial]) -> set[int]:
    return {n for t in trials for n in t.system_attrs.get(RETRY_HISTORY, [])}


def _counts(trial: FrozenTrial, retried: set[int]) -> bool:
    if not is_configuration(trial):
        return False  # another backend's point of a model trained elsewhere, or a duplicate
    if trial.state == TrialState.PRUNED and SKIPPED_ATTR in trial.user_attrs:
        return False
    return not (trial.state == TrialState.FAIL and trial.number in retried)


def trained(trials: Sequence[FrozenTrial], before: int | None = None) -> int:
    """Counted trials (below trial number `before`, if given)."""
    retried = retried_numbers(trials)
    return sum(1 for t in trials if (before is None or t.number < before) and _counts(t, retried))


def retry_template(trial: FrozenTrial) -> FrozenTrial:
    """A queued copy of `trial` with its configuration's params, recording which trial it
    retries."""
    history = [*trial.system_attrs.get(RETRY_HISTORY, []), trial.number]
    params = {name: value for name, value in trial.params.items() if name != BACKEND_KEY}
    return optuna.trial.create_trial(
        state=TrialState.WAITING,
        params=params,
        distributions={name: trial.distributions[name] for name in params},
        system_attrs={"failed_trial": history[0], RETRY_HISTORY: history},
    )
