"""Which data settings each point was trained and validated on; the points of today's.

A recorded change of a `data.*` setting (`study.change_settings`, `tuner.store.settings`) can change
the split. Points made before it were trained and validated on other examples: their validation
accuracies do not compare with today's, and today's test split may hold their training examples.
So every point records a fingerprint of the study's data settings (`DATA_SETTINGS_ATTR`), and the
front, the report and the trials that judge against the front keep only the points of the
study's current data settings. A point made before points recorded one counts as made on the
settings the study held then: today's, with every change recorded after it undone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.errors import ConfigError
from tuner.keys import CHANGES_ATTR, DATA_SETTINGS_ATTR
from tuner.store.settings import ABSENT, covered, settings_in

DATA_PREFIX = "data"
# Enough hex digits that two data settings of one study never share one by chance.
_FINGERPRINT_CHARS = 12


def data_fingerprint(settings: Mapping[str, Any]) -> str:
    """A short digest of the `data.*` values among `settings` (dotted keys); equal data settings
    give equal fingerprints, whatever else the settings hold."""
    data = {key: value for key, value in settings.items() if covered(key, [DATA_PREFIX])}
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:_FINGERPRINT_CHARS]


def data_changes(study_attrs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The study's recorded changes of `data.*` settings, oldest first."""
    changes = study_attrs.get(CHANGES_ATTR) or []
    return [change for change in changes if covered(str(change["key"]), [DATA_PREFIX])]


def settings_when_made(
    trial_number: int, settings: Mapping[str, Any], changes: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The settings the study held when trial `trial_number` was made: `settings` (today's)
    with each of `changes` recorded after it undone, latest first. A change records how many
    trials the study had (`after_trials`); trial numbers count up from 0, so a trial numbered
    below that count was made before the change."""
    then = dict(settings)
    for change in reversed(changes):
        if trial_number >= int(change["after_trials"]):
            break
        if change["from"] == ABSENT:
            then.pop(str(change["key"]), None)
        else:
            then[str(change["key"])] = change["from"]
    return then


def fingerprint_of(
    trial: FrozenTrial, settings: Mapping[str, Any], changes: Sequence[Mapping[str, Any]]
) -> str:
    """The data fingerprint the trial recorded, or, for one made before trials recorded it, that
    of the settings the study held when it was made."""
    recorded = trial.user_attrs.get(DATA_SETTINGS_ATTR)
    if recorded is not None:
        return str(recorded)
    return data_fingerprint(settings_when_made(trial.number, settings, changes))


@dataclass(frozen=True)
class CurrentSplit:
    """The trials made on the study's current data settings, and the points left out.

    Attributes:
        fingerprint: of the study's current data settings; None for a study that keeps no
            settings (made by an older version), whose trials are all kept.
        trials: every trial made on the current data settings, whatever its state.
        left_out: the numbers of the complete trials (points) made on other data settings.
        changed_keys: the `data.*` keys changed since the earliest point left out.
    """

    fingerprint: str | None
    trials: list[FrozenTrial]
    left_out: tuple[int, ...] = ()
    changed_keys: tuple[str, ...] = ()

    def changes_named(self) -> str:
        # A point recorded settings that no recorded change explains only where it was made by
        # a worker given other settings; the keys are then unknown.
        return ", ".join(self.changed_keys) or "the data settings"

    def refuse_without_points(self, study_name: str) -> None:
        """Refused where every point was trained on data settings changed since: the split of
        today's may hold their training examples, so none can be tested or recommended."""
        has_current = any(t.state == TrialState.COMPLETE for t in self.trials)
        if self.left_out and not has_current:
            raise ConfigError(
                f"Study '{study_name}' has no point trained on its current data settings: its "
                f"{len(self.left_out)} point(s) were trained before the recorded change of "
                f"{self.changes_named()} (study.change_settings), on another split, and the "
                "test split of today's settings may hold their training examples. Run the study "
                "to train points on the current settings."
            )

    def note(self) -> str | None:
        """Why points are missing from the front; None when none are."""
        if not self.left_out:
            return None
        count = len(self.left_out)
        return (
            f"{count} point{'s' if count > 1 else ''} left out: trained and validated before "
            f"the recorded change of {self.changes_named()} (study.change_settings), on another "
            "split; the front holds only points of the current data settings."
        )


def current_split(trials: Sequence[FrozenTrial], study_attrs: Mapping[str, Any]) -> CurrentSplit:
    """The trials of the study's current data settings (`study_attrs`: its user attributes)."""
    settings = settings_in(study_attrs)
    if settings is None:
        return CurrentSplit(fingerprint=None, trials=list(trials))
    changes = data_changes(study_attrs)
    now = data_fingerprint(settings)
    kept = [t for t in trials if fingerprint_of(t, settings, changes) == now]
    kept_numbers = {t.number for t in kept}
    left_out = tuple(
        t.number for t in trials if t.state == TrialState.COMPLETE and t.number not in kept_numbers
    )
    earliest = min(left_out, default=None)
    keys = sorted(
        {
            str(change["key"])
            for change in changes
            if earliest is not None and int(change["after_trials"]) > earliest
        }
    )
    return CurrentSplit(now, kept, left_out, tuple(keys))
