"""Search spaces: dotted config keys mapped to sweep expressions in Hydra's sweep grammar.

`train.weight_decay: tag(log, interval(1e-6, 1e-4))` becomes a log-scaled
`optuna.distributions.FloatDistribution`; `choice(...)` a categorical one; `range(a, b, s)` an
integer (or stepped float) one whose upper end excludes `b`, as Python's `range` does. A plain
value fixes the key for every trial. Every error names the file and the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from tuner.errors import ConfigError

_MISSING = object()
_CATEGORICAL_TYPES = (type(None), bool, int, float, str)


@dataclass(frozen=True)
class SearchSpace:
    """What a trial samples (`distributions`) and what every trial shares (`fixed`)."""

    distributions: dict[str, BaseDistribution] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)

    @property
    def keys(self) -> list[str]:
        return [*self.distributions, *self.fixed]


class _SpaceError(ConfigError):
    def __init__(self, source: str, key: str, message: str) -> None:
        super().__init__(f"Invalid search space in {source}: key '{key}': {message}")


def fits(distribution: BaseDistribution, value: Any) -> bool:
    """Whether `value` is one the distribution can hold (a choice, or within the range)."""
    if isinstance(distribution, CategoricalDistribution):
        return value in distribution.choices
    low, high = distribution.low, distribution.high  # type: ignore[attr-defined]
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high


def parse_expression(key: str, expression: Any, source: str = "<search_space>") -> Any:
    """Parse one sweep expression into an Optuna distribution, or return a plain fixed value."""
    if not isinstance(expression, str):
        _check_fixed_value(key, expression, source)
        return expression
    try:
        override = OverridesParser.create().parse_override(f"{key}={expression}")
    except HydraException as exc:
        message = str(exc).strip().splitlines()[0]
        raise _SpaceError(source, key, f"cannot parse '{expression}': {message}") from None
    if not override.is_sweep_override():
        value = override.value()
        _check_fixed_value(key, value, source)
        return value
    return _distribution(override, key, expression, source)


def _check_fixed_value(key: str, value: Any, source: str) -> None:
    if not isinstance(value, _CATEGORICAL_TYPES):
        raise _SpaceError(source, key, f"a fixed value must be a scalar, got {value!r}")


def _distribution(override: Override, key: str, expression: str, source: str) -> BaseDistribution:
    sweep = override.value()
    tags = set(getattr(sweep, "tags", ()) or ())
    unknown_tags = tags - {"log"}
    if unknown_tags:
        raise _SpaceError(source, key, f"unknown tag(s) {sorted(unknown_tags)} in '{expression}'")
    log = "log" in tags
    if isinstance(sweep, ChoiceSweep):
        return _categorical(sweep, key, expression, source, log)
    if isinstance(sweep, RangeSweep):
        return _stepped(override, key, expression, source, log)
    if isinstance(sweep, IntervalSweep):
        return _interval(sweep, key, expression, source, log)
    raise _SpaceError(
        source, key, f"'{expression}' is not supported; use choice(), range() or interval()"
    )


def _categorical(
    sweep: ChoiceSweep, key: str, expression: str, source: str, log: bool
) -> BaseDistribution:
    if log:
        raise _SpaceError(source, key, "tag(log, ...) applies to interval() and range() only")
    choices = list(sweep.list)
    if not choices:
        raise _SpaceError(source, key, f"'{expression}' has no choices")
    for choice in choices:
        if not isinstance(choice, _CATEGORICAL_TYPES):
            raise _SpaceError(source, key, f"choice {choice!r} is not a scalar")
    if len(set(map(repr, choices))) != len(choices):
        raise _SpaceError(source, key, f"'{expression}' repeats a choice")
    return CategoricalDistribution(choices)


def _stepped(
    override: Override, key: str, expression: str, source: str, log: bool
) -> BaseDistribution:
    sweep = override.value()
    assert isinstance(sweep, RangeSweep)
    if sweep.step is None or sweep.step <= 0:
        raise _SpaceError(source, key, f"'{expression}' needs a positive step")
    # Hydra enumerates the values exactly as a sweep would; the stop value is excluded.
    values = list(override.sweep_iterator())
    if not values:
        raise _SpaceError(
            source, key, f"'{expression}' is empty (range() excludes its stop, as Python's does)"
        )
    start, high, step = values[0], values[-1], sweep.step
    if all(isinstance(v, int) for v in (start, high, step)):
        if log and step != 1:
            raise _SpaceError(source, key, "tag(log, range(...)) needs a step of 1")
        return IntDistribution(start, high, log=log, step=1 if log else step)
    if log:
        raise _SpaceError(source, key, "tag(log, ...) is not supported on a float range()")
    # Snap the end to the step grid, undoing float drift (0.1 + 0.1 + 0.1 != 0.3).
    high = round(start + round((high - start) / step) * step, 12)
    return FloatDistribution(float(start), float(high), step=float(step))


def _interval(
    sweep: IntervalSweep, key: str, expression: str, source: str, log: bool
) -> BaseDistribution:
    low, high = sweep.start, sweep.end
    if low is None or high is None:
        raise _SpaceError(source, key, f"'{expression}' needs both bounds")
    if low > high:
        raise _SpaceError(source, key, f"low {low} > high {high} in '{expression}'")
    if log and low <= 0:
        raise _SpaceError(source, key, f"a log scale needs low > 0, got {low} in '{expression}'")
    return FloatDistribution(float(low), float(high), log=log)


def build_search_space(
    space: Mapping[str, Any], config: DictConfig, sources: Mapping[str, str] | None = None
) -> SearchSpace:
    """Parse and check a composed `search_space` node against the config it will change.

    Args:
        space: dotted config key -> sweep expression or fixed value.
        config: the composed config; every key must name an existing entry of it.
        sources: key -> file that defined it, for error messages.
    """
    sources = sources or {}
    result = SearchSpace()
    for key, expression in space.items():
        source = sources.get(key, "<search_space>")
        current = OmegaConf.select(config, key, default=_MISSING, throw_on_missing=False)
        if current is _MISSING or key.startswith("search_space"):
            raise _SpaceError(source, key, "unknown key: the composed config has no such entry")
        if isinstance(current, (DictConfig, list)) or OmegaConf.is_config(current):
            raise _SpaceError(source, key, "names a config group, not a single value")
        parsed = parse_expression(key, expression, source)
        if isinstance(parsed, BaseDistribution):
            parsed = _match_config_type(parsed, current, key, source)
            result.distributions[key] = parsed
        else:
            result.fixed[key] = parsed
    return result


def _match_config_type(
    distribution: BaseDistribution, current: Any, key: str, source: str
) -> BaseDistribution:
    """Keep integer keys integer: an interval on an int entry samples ints."""
    if isinstance(current, bool) or not isinstance(current, int):
        return distribution
    if isinstance(distribution, FloatDistribution):
        low, high = distribution.low, distribution.high
        if not (low.is_integer() and high.is_integer()) or distribution.step not in (None, 1.0):
            raise _SpaceError(
                source, key, f"the config value is an int ({current}); the space samples floats"
            )
        return IntDistribution(int(low), int(high), log=distribution.log)
    return distribution


def candidate_values(distribution: BaseDistribution) -> list[Any]:
    """The values worth checking: every choice, or both ends of a range."""
    if isinstance(distribution, CategoricalDistribution):
        return list(distribution.choices)
    return [distribution.low, distribution.high]  # type: ignore[attr-defined]
