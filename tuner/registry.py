"""Name -> implementation registries (data sources, models, edits, backends, ...)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from tuner.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table filled by `@registry.register("name")`; duplicates fail loudly.

    Args:
        config_key: the config key whose value selects an entry, named in lookup errors.
    """

    def __init__(self, config_key: str) -> None:
        self.config_key = config_key
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"'{name}' is already registered for {self.config_key}")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(
                f"Invalid config: key '{self.config_key}': unknown value '{name}'; "
                f"choose one of {', '.join(sorted(self._entries))}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
