"""Every use of Optuna's private API, in one place: an Optuna upgrade is checked here, and by
`tests/store/test_optuna_compat.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from datetime import datetime
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.storages._heartbeat import (  # noqa: F401
    BaseHeartbeat,
    get_heartbeat_thread,
    is_heartbeat_enabled,
)
from optuna.trial import FrozenTrial, TrialState


def storage_of(study: optuna.Study) -> optuna.storages.BaseStorage:
    return study._storage


def study_id_of(study: optuna.Study) -> int:
    return study._study_id


def trial_id_of(trial: optuna.Trial | FrozenTrial) -> int:
    return trial._trial_id


def heartbeat_of(trial_id: int, storage: optuna.storages.BaseStorage):
    """A context manager that beats for a trial run outside `study.optimize` (which beats for
    its own trials); a no-op where the storage keeps no heartbeats."""
    return get_heartbeat_thread(trial_id, storage)


def stale_trial_ids(storage: optuna.storages.RDBStorage, study_id: int) -> list[int]:
    """Running trials whose heartbeat lapsed; Optuna keeps this comparison inside the storage."""
    return list(storage._get_stale_trial_ids(study_id))


class SingleAttemptRDBStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage, but making a trial in one attempt, and a running trial with a
    heartbeat from its start.

    Optuna tries five times when a commit fails, and a commit whose answer was lost after the
    server made it would make a second trial: a configuration queued twice, or a trial no worker
    runs. Optuna records a trial's first heartbeat once its heartbeat thread starts, and its stale
    check skips a running trial without one: a worker that died in between (or whose connection
    dropped after the commit) left a trial that nobody failed, ever. Here the heartbeat is written
    in the transaction that makes the trial running, so every running trial goes stale by the
    database's clock like any other."""

    def _create_new_trial(
        self, study_id: int, template_trial: FrozenTrial | None = None
    ) -> FrozenTrial:
        from optuna.storages._rdb import models, storage  # SQLAlchemy's ORM, imported when used

        with storage._create_scoped_session(self.scoped_session) as session:
            # The study's row is locked, as Optuna does, so that trial numbers do not race.
            models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
            trial = self._get_prepared_new_trial(study_id, template_trial, session)
            trial_id = trial.trial_id
            if trial.state == TrialState.RUNNING:
                session.add(models.TrialHeartbeatModel(trial_id=trial_id))
        return self.get_trial(trial_id)

    def set_trial_state_values(self, trial_id, state, values=None) -> bool:
        if state != TrialState.RUNNING:
            return super().set_trial_state_values(trial_id, state, values)
        # Claiming a waiting trial, as Optuna does, with its first heartbeat; False where
        # another worker claimed it (or finished it) first.
        from optuna.storages._rdb import models, storage

        with storage._create_scoped_session(self.scoped_session) as session:
            trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
            if trial.state != TrialState.WAITING:
                return False
            trial.state, trial.datetime_start = state, datetime.now()
            session.add(models.TrialHeartbeatModel(trial_id=trial_id))
        return True


def unbeaten_trial_ids(storage: optuna.storages.RDBStorage, study_id: int) -> list[int]:
    """Running trials without a heartbeat row: left by a version of tuner that made them
    without one, whose worker died between making the trial and its first heartbeat."""
    from optuna.storages._rdb import models

    with storage.scoped_session() as session:
        running = session.query(models.TrialModel).filter_by(
            study_id=study_id, state=TrialState.RUNNING
        )
        return [trial.trial_id for trial in running if not trial.heartbeats]


def completed_copy(
    trial: FrozenTrial, values: Sequence[float], constraints: dict[str, float]
) -> FrozenTrial:
    """`trial` as a COMPLETE one with `values` and `constraints`, keeping its number and id
    (samplers order and cache trials by them)."""
    copy = optuna.trial.create_trial(
        state=TrialState.COMPLETE,
        values=list(values),
        params=trial.params,
        distributions=trial.distributions,
        user_attrs=trial.user_attrs,
        system_attrs={
            k: v for k, v in trial.system_attrs.items() if not k.startswith("constraints:")
        },
        constraints=constraints,
    )
    copy.number = trial.number
    copy._trial_id = trial._trial_id
    copy.datetime_start, copy.datetime_complete = trial.datetime_start, trial.datetime_complete
    return copy


class _StudyView:
    """A study as a sampler sees it: only the trials `keep` accepts, each as `shown` presents
    it. Samplers read trials through `_get_trials` (cached) or `get_trials`; everything else
    goes to the study."""

    def __init__(
        self,
        study: optuna.Study,
        keep: Callable[[FrozenTrial], bool],
        shown: Callable[[FrozenTrial], FrozenTrial],
    ) -> None:
        self._study = study
        self._keep = keep
        self._shown = shown

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(
        self,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
        use_cache: bool = False,
    ) -> list[FrozenTrial]:
        # All states first: `shown` may present a trial in another state than it is stored in.
        trials = self._study._get_trials(deepcopy=deepcopy, states=None, use_cache=use_cache)
        shown = [self._shown(t) for t in trials if self._keep(t)]
        return [t for t in shown if states is None or t.state in states]

    def get_trials(
        self, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        return self._get_trials(deepcopy, states, use_cache=False)

    @property
    def trials(self) -> list[FrozenTrial]:
        return self.get_trials()


class FilteredSampler(BaseSampler):
    """A sampler that learns only from the trials `keep` accepts (its start-up count included),
    each as `shown` presents it; the study itself keeps all of them as they are."""

    def __init__(
        self,
        inner: BaseSampler,
        keep: Callable[[FrozenTrial], bool],
        shown: Callable[[FrozenTrial], FrozenTrial] = lambda trial: trial,
    ) -> None:
        self.inner = inner
        self.keep = keep
        self.shown = shown

    def _view(self, study: optuna.Study) -> Any:
        return _StudyView(study, self.keep, self.shown)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(self._view(study), trial)

    def sample_relative(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        search_space: dict[str, BaseDistribution],
    ) -> dict[str, Any]:
        return self.inner.sample_relative(self._view(study), trial, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self.inner.sample_independent(
            self._view(study), trial, param_name, param_distribution
        )

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(self._view(study), trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self.inner.after_trial(self._view(study), trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()
