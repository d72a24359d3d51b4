"""The command that trains one point's model again, exactly.

It is the invocation's own command line with every searched key pinned to the point's value
(pinned keys are not searched), one trial, and a study of its own so that the original study is
left as it was; Hydra's own settings (`hydra.*`) are left to each invocation. Model building
and training are seeded (`train.seed`, `data.split_seed`), so the retrained model matches the
point's.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser

from tuner.secrets import mask_urls_in

_PROFILE_PREFIX = "debug.overrides."
# Keys a pinned key makes moot: the point's own backend (`deploy.backend`) replaces the list of
# backends the invocation deployed on (`deploy.backends`), which may not be set beside it.
_MOOT = {"deploy.backends": "deploy.backend"}
_PLAIN = re.compile(r"^[A-Za-z_][\w.\-/]*$")


def override_keys(overrides: Sequence[str]) -> set[str]:
    """The config keys (or groups) that command-line overrides set."""
    return {o.key_or_group for o in OverridesParser.create().parse_overrides(list(overrides))}


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in {"true", "false", "null"}:
        return text
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def retrain_overrides(
    invocation: Sequence[str],
    params: Mapping[str, Any],
    study_name: str,
    point: str,
    profile_keys: Collection[str] = (),
) -> list[str]:
    """Hydra overrides that retrain the point with `params` (its searched values).

    Args:
        invocation: the overrides of the invocation that made the point (`+experiment=...`
            and anything the user set).
        study_name: the configured `study.name` before any debug profile suffix.
        point: names the point within its study (`<trained in trial>-<backend>`), so that
            every point retrains into a study of its own.
        profile_keys: keys the active debug profile sets; they can only be changed through
            `debug.overrides.<key>`, since the profile is laid over the command line.
    """
    settings = {**params, "study.n_trials": 1, "study.name": f"{study_name}-retrain-{point}"}
    parsed = OverridesParser.create().parse_overrides(list(invocation))
    kept = [
        o.input_line
        for o in parsed
        if o.key_or_group.removeprefix(_PROFILE_PREFIX) not in settings
        and _MOOT.get(o.key_or_group) not in settings
        and not o.key_or_group.startswith("hydra.")
    ]
    return kept + [
        f"{_PROFILE_PREFIX if key in profile_keys else ''}{key}={_value(value)}"
        for key, value in settings.items()
    ]


def retrain_command(overrides: Sequence[str]) -> str:
    """The command line, with the password of a URL in it (`study.storage=...`) masked: it is
    recorded for others to read. The password is given to the retraining run as to any other
    (PGPASSWORD, ~/.pgpass), or typed in again."""
    return shlex.join(["python", "-m", "tuner", *map(mask_urls_in, overrides)])
