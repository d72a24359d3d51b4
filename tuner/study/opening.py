"""A study opened in its storage: created, or resumed where no other worker writes the same
SQLite file, the objectives are the same and the search space samples as the earlier trials
did; then the settings it keeps are settled against this run's."""

from __future__ import annotations

import os
import socket
import zlib
from collections.abc import Mapping
from contextlib import ExitStack

import optuna
from omegaconf import DictConfig
from optuna.distributions import CategoricalDistribution, check_distribution_compatibility

from tuner import console
from tuner.config import SearchSpace
from tuner.errors import ConfigError
from tuner.front import sampler_view
from tuner.keys import BACKEND_KEY, REFERENCE_ATTR
from tuner.secrets import mask_url
from tuner.store import (
    DIRECTIONS,
    FilteredSampler,
    Heartbeat,
    LeaseHeld,
    Leases,
    beat_for_unbeaten,
    budget,
    check_change_keys,
    is_sqlite,
    open_storage,
    settings_of,
    settle,
)
from tuner.study.backends import described
from tuner.study.checks import defined_in
from tuner.study.samplers import SAMPLERS
from tuner.study.stale_trials import StaleTrials
from tuner.tracking import Tracker


def _worker_salt(url: str) -> int:
    """0 for SQLite (one worker); otherwise different per process, so that workers starting
    together on a server database do not all draw the same first configurations."""
    if is_sqlite(url):
        return 0
    return zlib.crc32(f"{socket.gethostname()}:{os.getpid()}".encode()) % 100_003


def _hold_sqlite_study(url: str, leases: Leases, lifetime: ExitStack) -> None:
    """On SQLite, this worker holds the study's `worker` lease until `lifetime` closes: a second
    worker is refused, however close together they start. The kernel releases the lease of a
    worker that dies; its running trial goes stale and this worker queues it again."""
    if not is_sqlite(url):
        return
    try:
        lifetime.enter_context(leases.hold("worker", wait=False))
    except LeaseHeld:
        raise ConfigError(
            f"Invalid config: key 'study.storage': another worker is running this study in "
            f"{url}. SQLite is not safe for parallel Optuna writers: give every worker a server "
            "database (study.storage=postgresql+psycopg://user@host/db) or Optuna's journal "
            "file (study.storage=journal:///shared/path/study.log, no server, but no "
            "heartbeats), or run one worker at a time."
        ) from None


def open_study(
    cfg: DictConfig, tracker: Tracker, leases: Leases, lifetime: ExitStack
) -> tuple[optuna.Study, optuna.storages.BaseStorage]:
    """The study `study.name` in `study.storage`, created or resumed (one line says which),
    with its stale trials failed and queued again; and the storage it is opened on. A SQLite
    study is this worker's alone until `lifetime` closes; `leases` are the study's."""
    check_change_keys([str(key) for key in cfg.study.change_settings])
    url = str(cfg.study.storage)
    heartbeat = Heartbeat.from_config(cfg.study.heartbeat)
    on_stale = StaleTrials(
        leases, tracker, int(cfg.study.heartbeat.max_retry), heartbeat.grace_period
    )
    # Before the storage is opened: it makes Optuna's tables in a new file.
    _hold_sqlite_study(url, leases, lifetime)
    storage, existing = open_storage(url, heartbeat, on_stale)
    resumed = str(cfg.study.name) in existing
    previous = 0
    if resumed:
        study_id = storage.get_study_id_from_name(str(cfg.study.name))
        beat_for_unbeaten(storage, study_id)
        previous = len(storage.get_all_trials(study_id, deepcopy=False))
    # A resumed study must not replay the first invocation's random draws. The sampler learns
    # from trained configurations only: another backend's point of a model is a near-duplicate
    # that would use up its start-up trials. Pruned ones it sees as the poor points they are.
    sampler = FilteredSampler(
        SAMPLERS.get(str(cfg.study.sampler))(int(cfg.study.seed) + previous + _worker_salt(url)),
        budget.is_configuration,
        sampler_view,
    )
    study = optuna.create_study(
        study_name=str(cfg.study.name),
        storage=storage,
        directions=list(DIRECTIONS),
        sampler=sampler,
        load_if_exists=True,
    )
    if study.directions != [optuna.study.StudyDirection[d.upper()] for d in DIRECTIONS]:
        raise ConfigError(
            f"Invalid config: key 'study.name': study '{study.study_name}' in {mask_url(url)} "
            f"has other objectives; choose another study.name"
        )
    # Trials whose worker died long enough ago are failed and queued again before counting.
    optuna.storages.fail_stale_trials(study)
    state = "Resuming" if resumed else "Created"
    done = budget.trained(study.get_trials(deepcopy=False))
    console.console.print(
        f"{state} study '{study.study_name}' ({previous} earlier trials, {done} of "
        f"{cfg.study.n_trials} configurations trained or training) in {mask_url(url)}"
    )
    return study, storage


def check_same_space(
    study: optuna.Study,
    space: SearchSpace,
    sources: Mapping[str, str],
    left_out: Mapping[str, str],
) -> None:
    """A resumed study samples every key as its earlier trials did: Optuna refuses other
    choices of a categorical key (or another kind of range) trial by trial, so that is
    refused here, once, before any training."""
    recorded: dict[str, optuna.distributions.BaseDistribution] = {}
    for trial in study.get_trials(deepcopy=False):
        for name, distribution in trial.distributions.items():
            recorded.setdefault(name, distribution)
    # A key the study searched that this run neither searches nor fixes (a renamed key, or a
    # search-space file left out) would mix two kinds of trials in one front.
    missing = sorted(set(recorded) - set(space.distributions) - set(space.fixed))
    if missing:
        raise ConfigError(
            f"Invalid config: key '{missing[0]}': study '{study.study_name}' searched "
            f"{', '.join(missing)}, which this run neither searches nor fixes; keep the "
            "study's search space, fix the key on the command line, or start another study.name"
        )
    for name, distribution in space.distributions.items():
        if name not in recorded:
            continue
        try:
            check_distribution_compatibility(recorded[name], distribution)
        except ValueError:
            hint = "; keep the study's search space, or start another study.name"
            verb, again = "samples it from", "would from"
            if name == BACKEND_KEY:
                verb, again = "deploys on", "would on"
                # The backends of a study are those the machine that started it could run.
                hint = (
                    (f" ({described(left_out)})" if left_out else "")
                    + "; give the study's list (deploy.backends=[...]), resume it on a machine "
                    "that runs the same backends, or start another study.name"
                )
            raise ConfigError(
                f"Invalid config: key '{name}': study '{study.study_name}' {verb} "
                f"{_shown(recorded[name])}, this run {again} {_shown(distribution)}{hint}"
                + defined_in(name, sources)
            ) from None


def _shown(distribution: optuna.distributions.BaseDistribution) -> str:
    if isinstance(distribution, CategoricalDistribution):
        return f"choice({', '.join(str(choice) for choice in distribution.choices)})"
    return repr(distribution)


def settle_settings(study: optuna.Study, cfg: DictConfig) -> None:
    """The study's settings settled against this run's (`tuner.store.settle`) and its
    objectives named."""
    given = settings_of(cfg)
    changed = settle(study, given, [str(key) for key in cfg.study.change_settings])
    # Named once the settings hold: a resume refused for another statistic renames nothing.
    study.set_metric_names(list(given["objectives"]))
    if any(key.startswith("study.hypervolume_reference") for key in changed):
        # A curve is only comparable against one reference: it starts again from the new one.
        study.set_user_attr(REFERENCE_ATTR, None)
