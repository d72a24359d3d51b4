"""The private Optuna API tuner relies on (`tuner.store.optuna_compat`), checked against the Optuna
installed: an upgrade that moves any of it fails here first."""

from __future__ import annotations

import time

import optuna
from optuna.distributions import FloatDistribution

from tuner.keys import DUPLICATE_ATTR, TRAINED_IN_ATTR
from tuner.store import budget
from tuner.store.optuna_compat import (
    FilteredSampler,
    is_heartbeat_enabled,
    stale_trial_ids,
    storage_of,
    study_id_of,
    trial_id_of,
)
from tuner.store.storage import Heartbeat, beat_for_unbeaten, open_storage

SPACE = {"x": FloatDistribution(0.0, 1.0)}


class _Recording(optuna.samplers.RandomSampler):
    """A real sampler that notes how many trials each of its calls saw."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.seen: list[tuple[str, int]] = []

    def before_trial(self, study, trial) -> None:
        self.seen.append(("before_trial", len(study._get_trials(deepcopy=False, use_cache=True))))

    def sample_independent(self, study, trial, name, distribution):
        self.seen.append(("sample_independent", len(study.get_trials(deepcopy=False))))
        return super().sample_independent(study, trial, name, distribution)


def _copy_of(trained_in: int, x: float) -> optuna.trial.FrozenTrial:
    """Another backend's point of the model trained in trial `trained_in`."""
    return optuna.trial.create_trial(
        params={"x": x},
        distributions=SPACE,
        values=[x, 1.0],
        user_attrs={TRAINED_IN_ATTR: trained_in},
    )


def test_the_sampler_sees_configurations_only():
    inner = _Recording()
    study = optuna.create_study(
        directions=["maximize", "minimize"],
        sampler=FilteredSampler(inner, budget.is_configuration),
    )

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        trial.set_user_attr(TRAINED_IN_ATTR, trial.number)
        x = trial.suggest_float("x", 0.0, 1.0)
        # Three more backends of this model, as the objective adds them.
        for _ in range(3):
            study.add_trial(_copy_of(trial.number, x))
        return x, 1.0

    study.optimize(objective, n_trials=3)
    assert len(study.trials) == 12  # the study keeps every point
    # Before trials 0, 1 and 2 the sampler saw 1, 2 and 3 trials (the new one included), never
    # the copies; sampling saw 0, 1 and 2 finished configurations plus the running one.
    assert [n for call, n in inner.seen if call == "before_trial"] == [1, 2, 3]
    assert [n for call, n in inner.seen if call == "sample_independent"] == [1, 2, 3]


def _draws(sampler: optuna.samplers.BaseSampler, copies: int, n_trials: int) -> list[float]:
    """The x drawn per trained model, each model adding `copies` more backends' points."""
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    drawn = []

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        trial.set_user_attr(TRAINED_IN_ATTR, trial.number)
        x = trial.suggest_float("x", 0.0, 1.0)
        drawn.append(x)
        for _ in range(copies):
            study.add_trial(_copy_of(trial.number, x))
        return x, 1.0 - x

    study.optimize(objective, n_trials=n_trials)
    return drawn


def test_tpe_start_up_counts_configurations_not_points():
    # During its start-up TPE draws what a random sampler of the same seed draws.
    random = _draws(optuna.samplers.RandomSampler(seed=0), copies=0, n_trials=3)
    tpe = _draws(
        FilteredSampler(
            optuna.samplers.TPESampler(seed=0, n_startup_trials=3), budget.is_configuration
        ),
        copies=3,
        n_trials=4,
    )
    assert tpe[:3] == random
    # Without the filter the first model's 4 points end the start-up at once.
    unfiltered = _draws(
        optuna.samplers.TPESampler(seed=0, n_startup_trials=3), copies=3, n_trials=2
    )
    assert unfiltered[0] == random[0] and unfiltered[1] != random[1]


def test_private_names_still_exist(tmp_path):
    storage, _ = open_storage(f"sqlite:///{tmp_path}/optuna.db", Heartbeat(1, 2))
    study = optuna.create_study(storage=storage)
    study.optimize(lambda trial: trial.suggest_float("x", 0.0, 1.0), n_trials=1)
    trial = study.trials[0]
    assert storage_of(study) is study._storage and study_id_of(study) == study._study_id
    assert storage_of(study).get_trial(trial_id_of(trial)).number == 0
    assert is_heartbeat_enabled(storage_of(study))
    running = study.ask()
    storage_of(study).record_heartbeat(trial_id_of(running))
    assert stale_trial_ids(storage.inner, study_id_of(study)) == []


def test_every_running_trial_has_a_heartbeat_from_its_start(tmp_path):
    # No trial ever beats (no worker runs it): Optuna's own storage writes no heartbeat until a
    # heartbeat thread starts, and its stale check skips such a trial for ever.
    url = f"sqlite:///{tmp_path}/optuna.db"
    # Left by an earlier version, made as Optuna's own storage makes it: given one on opening.
    earlier = optuna.create_study(storage=optuna.storages.RDBStorage(url), study_name="s")
    left = earlier.ask()
    storage, _ = open_storage(url, Heartbeat(1, 1))
    study = optuna.load_study(study_name="s", storage=storage)
    beat_for_unbeaten(storage, study_id_of(study))
    made = study.ask()
    study.enqueue_trial({})
    claimed = study.ask()
    assert claimed.number == 2 and stale_trial_ids(storage.inner, study_id_of(study)) == []
    # Stale after 1 s of silence; SQLite's clock counts whole seconds.
    time.sleep(2.2)
    stale = stale_trial_ids(storage.inner, study_id_of(study))
    assert sorted(stale) == [trial_id_of(left), trial_id_of(made), trial_id_of(claimed)]


def test_the_sampler_never_sees_a_duplicate_teacher_trial():
    inner = _Recording()
    study = optuna.create_study(
        directions=["maximize", "minimize"],
        sampler=FilteredSampler(inner, budget.is_configuration),
    )
    # Finished unrun, without params: no draw of the space, and no start-up trial either.
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.PRUNED, system_attrs={DUPLICATE_ATTR: True}
        )
    )
    study.optimize(lambda trial: (trial.suggest_float("x", 0.0, 1.0), 1.0), n_trials=1)
    assert inner.seen == [("before_trial", 1), ("sample_independent", 1)]
