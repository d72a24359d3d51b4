"""Composing a study's config with Hydra, and its search spaces as Optuna distributions."""

from __future__ import annotations

from tuner.config.compose import (
    CONF_DIR,
    SEARCH_SPACE_DIR,
    apply_debug,
    compose_config,
    debug_profile_keys,
    load_search_space,
    register_resolvers,
    resolve,
    search_space_sources,
    with_params,
)
from tuner.config.space import SearchSpace, candidate_values, fits

__all__ = [
    "CONF_DIR",
    "SEARCH_SPACE_DIR",
    "SearchSpace",
    "apply_debug",
    "candidate_values",
    "compose_config",
    "debug_profile_keys",
    "fits",
    "load_search_space",
    "register_resolvers",
    "resolve",
    "search_space_sources",
    "with_params",
]
