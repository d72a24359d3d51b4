"""The settings that shape a study's results, kept in the study itself.

Constraints, the data source and split, the latency protocol, the hypervolume reference and the
objectives decide what the front is. They are stored in the study (an Optuna user attribute)
when it is created, so a resume, another worker and `python -m tuner.report` all read the same
ones instead of today's command line. A run whose settings contradict the stored ones is
refused, naming the key and both values; `study.change_settings=[KEY, ...]` takes the new value
of those keys (or of every key under a prefix such as `data`) deliberately, and records the
change in the study (`settings_changes`: key, old and new value, when, after how many trials).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Collection, Mapping
from typing import Any

import optuna
from omegaconf import DictConfig, OmegaConf

from tuner import console
from tuner.errors import ConfigError
from tuner.keys import CHANGES_ATTR, SETTINGS_ATTR
from tuner.latency import DEFAULT_STATISTIC, STATISTIC_KEY, objective_name

# Every study's objective directions, in Optuna's order; their names: `objectives`.
DIRECTIONS = ("maximize", "minimize")
CHANGE_KEY = "study.change_settings"
# The config nodes whose values shape the results; a dotted key stands for its whole subtree.
SHAPING = (
    "study.max_accuracy_drop",
    "study.latency_budget_ms",
    "study.hypervolume_reference",
    "study.target_machine",
    "data",
    "deploy.latency",
)
# Where a file is cached changes nothing it holds; more sessions for the front's latencies
# only confirm what the table holds, so any run may ask for more; which rounds count as steady
# chooses among measurements of the same latency.
_NOT_SHAPING = frozenset(
    {
        "data.cache_dir",
        "deploy.latency.front_sessions",
        "deploy.latency.steady_within",
        "deploy.latency.steady_attempts",
        "deploy.latency.steady_wait_s",
    }
)
# Settings added after studies were made: what a study that lacks one was made with.
_INTRODUCED = {STATISTIC_KEY: DEFAULT_STATISTIC, "study.target_machine": None}
# What the points already made were ranked by: never changed, not even on purpose.
_FIXED = frozenset({"objectives", STATISTIC_KEY})
_FIXED_HINT = (
    "a study keeps the objectives and the latency statistic its points were ranked by; use the "
    "study's value or start another study.name"
)
# How a change record spells a setting that one side lacks.
ABSENT = "<absent>"


def objectives(statistic: str) -> dict[str, str]:
    """The study's objectives (name -> direction) when it ranks latency by `statistic`."""
    names = ("val_accuracy", objective_name(statistic))
    return dict(zip(names, DIRECTIONS, strict=True))


def settings_of(cfg: DictConfig) -> dict[str, Any]:
    """The shaping settings of `cfg` as dotted keys (`data.split_seed`: 0), and the objectives
    (name -> direction)."""
    flat: dict[str, Any] = {}
    for key in SHAPING:
        node = OmegaConf.select(cfg, key)
        value = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        _flatten(key, value, flat)
    flat["objectives"] = objectives(str(flat.get(STATISTIC_KEY, DEFAULT_STATISTIC)))
    return {key: value for key, value in flat.items() if key not in _NOT_SHAPING}


def _flatten(prefix: str, value: Any, into: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}", item, into)
    else:
        into[prefix] = value


def check_change_keys(keys: Collection[str]) -> None:
    """Each key of `study.change_settings` names a shaping setting or a node above some."""
    for key in keys:
        if key in _FIXED:
            raise ConfigError(f"Invalid config: key '{CHANGE_KEY}': {key!r}: {_FIXED_HINT}")
        if not any(covered(key, [shaping]) or covered(shaping, [key]) for shaping in SHAPING):
            raise ConfigError(
                f"Invalid config: key '{CHANGE_KEY}': {key!r} is not a study setting; the "
                f"settings are {', '.join(SHAPING)} and the keys under them"
            )


def covered(key: str, prefixes: Collection[str]) -> bool:
    return any(key == p or key.startswith(f"{p}.") for p in prefixes)


def differences(stored: Mapping[str, Any], given: Mapping[str, Any]) -> list[str]:
    return sorted(
        key for key in set(stored) | set(given) if stored.get(key, ABSENT) != given.get(key, ABSENT)
    )


def contradiction(study_name: str, key: str, stored: Any, given: Any, hint: str) -> ConfigError:
    return ConfigError(
        f"Invalid config: key '{key}': study '{study_name}' was created with "
        f"{key}={_shown(stored)}, this command gives {key}={_shown(given)}; {hint}"
    )


def _shown(value: Any) -> str:
    # As a command line would spell it: null, 0.02, "csv".
    return ABSENT if value is ABSENT else json.dumps(value)


def settle(study: optuna.Study, given: Mapping[str, Any], changes: Collection[str]) -> list[str]:
    """Store `given` in a new study; in an existing one, refuse a contradiction unless its key
    is in `changes`, and record each change taken. Returns the keys changed."""
    stored = stored_settings(study)
    if stored is None:
        if study.get_trials(deepcopy=False):
            # Its points were made as the settings added since had it then.
            for key, then in _INTRODUCED.items():
                if given.get(key, then) != then:
                    raise contradiction(study.study_name, key, then, given[key], _FIXED_HINT)
            console.console.print(
                f"Study '{study.study_name}' keeps no settings (made by an older version): "
                "this command's are stored and hold from now on."
            )
        study.set_user_attr(SETTINGS_ATTR, dict(given))
        return []
    changed = differences(stored, given)
    for key in changed:
        if key in _FIXED:
            raise contradiction(
                study.study_name,
                key,
                stored.get(key, ABSENT),
                given.get(key, ABSENT),
                _FIXED_HINT,
            )
        if not covered(key, changes):
            raise contradiction(
                study.study_name,
                key,
                stored.get(key, ABSENT),
                given.get(key, ABSENT),
                f"use the study's value, or set {CHANGE_KEY}=[{key}] to change it on purpose "
                "(the change is recorded in the study), or start another study.name",
            )
    if not changed:
        return []
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    trials = len(study.get_trials(deepcopy=False))
    records = [
        {
            "key": key,
            "from": stored.get(key, ABSENT),
            "to": given.get(key, ABSENT),
            "at": now,
            "after_trials": trials,
        }
        for key in changed
    ]
    for record in records:
        console.console.print(
            f"[yellow]Study setting {record['key']} changed from {_shown(record['from'])} to "
            f"{_shown(record['to'])} ({CHANGE_KEY}); recorded in the study.[/]"
        )
    study.set_user_attr(CHANGES_ATTR, [*study.user_attrs.get(CHANGES_ATTR, []), *records])
    study.set_user_attr(SETTINGS_ATTR, dict(given))
    return changed


def stored_settings(study: optuna.Study) -> dict[str, Any] | None:
    return settings_in(study.user_attrs)


def settings_in(user_attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The settings stored in a study's user attributes, a setting added since the study was
    made reading as the value it was made with; None for a study that keeps none."""
    stored = user_attrs.get(SETTINGS_ATTR)
    return None if stored is None else {**_INTRODUCED, **stored}


def typed_contradiction(
    study_name: str,
    stored: Mapping[str, Any],
    given: Mapping[str, Any],
    typed: Collection[str],
    allowed: Collection[str] = (),
) -> ConfigError | None:
    """For a command that reads a study (the report): the first stored setting that a key
    typed on its command line (or a group such as `data=csv`) gives another value, unless
    `allowed` covers it."""
    for key in differences(stored, given):
        if covered(key, typed) and not covered(key, allowed):
            return contradiction(
                study_name,
                key,
                stored.get(key, ABSENT),
                given.get(key, ABSENT),
                "the study's own settings are used; leave the key off this command (or, for "
                f"data that lives elsewhere on this machine, add {CHANGE_KEY}=[{key}])",
            )
    return None


def subtree(settings: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The nested config under `prefix` (`data`) rebuilt from dotted settings."""
    nested: dict[str, Any] = {}
    for key, value in settings.items():
        if not key.startswith(f"{prefix}."):
            continue
        node = nested
        *parents, leaf = key.removeprefix(f"{prefix}.").split(".")
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return nested
