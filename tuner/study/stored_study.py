"""A stored study read back for review, as `python -m tuner.report` reads it while it runs or
after: loaded by name (nothing is created), with the constraints and data config it was made
with."""

from __future__ import annotations

import optuna
from omegaconf import DictConfig, OmegaConf

from tuner import console
from tuner.errors import ConfigError
from tuner.front import Constraints
from tuner.secrets import mask_url
from tuner.store import (
    covered,
    open_storage,
    settings_of,
    stored_settings,
    subtree,
    typed_contradiction,
)


def load_study(cfg: DictConfig) -> optuna.Study:
    """The study `study.name` in `study.storage`; one that is not there is refused with the
    names of those that are."""
    name, url = str(cfg.study.name), str(cfg.study.storage)
    storage, names = open_storage(url)
    if name not in names:
        known = ", ".join(sorted(names)) or "none"
        raise ConfigError(
            f"Invalid config: key 'study.name': no study '{name}' in {mask_url(url)} (studies "
            f"there: {known}); pass the overrides the study was run with"
        )
    return optuna.load_study(study_name=name, storage=storage)


def study_settings(
    study: optuna.Study, cfg: DictConfig, typed: set[str]
) -> tuple[Constraints, DictConfig]:
    """The constraints and data config the study was made with (`tuner.store.settings`); a key typed
    on this command line that says otherwise is refused."""
    stored = stored_settings(study)
    if stored is None:
        console.console.print(
            f"Study '{study.study_name}' keeps no settings (made by an older version): its "
            "constraints and test split are read from this command line."
        )
        return Constraints.from_config(cfg.study), cfg.data
    # Keys in study.change_settings are this command's to set (a dataset moved elsewhere on
    # this machine); nothing is recorded, as the report changes no study.
    allowed = [str(key) for key in cfg.study.change_settings]
    given = settings_of(cfg)
    problem = typed_contradiction(study.study_name, stored, given, typed, allowed)
    if problem:
        raise problem
    settings = {**stored, **{k: v for k, v in given.items() if covered(k, allowed)}}
    constraints = Constraints.of_settings(settings)
    # Where a dataset is cached is this machine's business; what it holds is the study's.
    cache = {"cache_dir": cfg.data.cache_dir} if "cache_dir" in cfg.data else {}
    data_cfg = OmegaConf.create({**subtree(settings, "data"), **cache})
    return constraints, data_cfg
