"""Opening the Optuna storage named by `study.storage`, with errors that name the key."""

from __future__ import annotations

import optuna

from tuner.errors import ConfigError


def open_storage(url: str) -> tuple[optuna.storages.BaseStorage, list[str]]:
    """The storage and the names of the studies it holds."""
    try:
        storage = optuna.storages.get_storage(url)
        names = [s.study_name for s in storage.get_all_studies()]
    except Exception as exc:
        raise ConfigError(
            f"Invalid config: key 'study.storage': cannot open {url}: {exc}"
        ) from None
    return storage, names
