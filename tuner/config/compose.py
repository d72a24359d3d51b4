"""Composition helpers: the repository root resolver, the debug profile, and start-up checks."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tuner.config.space import SearchSpace, build_search_space
from tuner.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = ROOT / "conf"
SEARCH_SPACE_DIR = ROOT / "search_spaces"

_ABSENT = object()
_REQUIRED = ("study.name", "study.n_trials", "study.storage", "tracking.uri", "data.source")


def register_resolvers() -> None:
    """`${tuner_root:}` puts the repository root on Hydra's search path (see conf/config.yaml)."""
    if not OmegaConf.has_resolver("tuner_root"):
        OmegaConf.register_new_resolver("tuner_root", lambda: ROOT.as_posix())


def compose_config(overrides: Sequence[str]) -> DictConfig:
    """The config `python -m tuner OVERRIDES` would run with, composed without starting a job
    (for tools that read a study, such as `python -m tuner.report`)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    register_resolvers()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))
    except HydraException as exc:
        raise ConfigError(f"Invalid overrides {' '.join(overrides)}: {exc}") from None


def apply_debug(cfg: DictConfig, typed: Collection[str] = ()) -> DictConfig:
    """Lay the selected debug profile (e.g. `debug=smoke`) over the composed config.

    The profile is applied after composition so that it shrinks any experiment, whatever the
    experiment sets; its own keys stay overridable as `debug.overrides.<key>=...`, and values
    `typed` on the command line (the keys of its overrides) win over it, so that nothing a
    user typed is replaced.
    """
    debug = cfg.get("debug")
    if not debug:
        return cfg
    merged = cfg.copy()
    # Hydra composes in struct mode; the profile may add keys (e.g. architecture overrides).
    OmegaConf.set_struct(merged, False)
    # The tiny model of the experiment's own family first, so `debug.overrides.model.*` wins.
    merged.merge_with({"model": _family_overrides(cfg)})
    merged.merge_with(debug.get("overrides") or {})
    raw = OmegaConf.to_container(cfg, resolve=False)
    for key in typed:
        # A config group chosen on the command line (`data=csv`) is a node the profile
        # shrinks, not a value it would replace.
        if key.startswith(("debug.", "hydra.")) or (CONF_DIR / key.replace(".", "/")).is_dir():
            continue
        value = _dotted(raw, key)
        if value is not _ABSENT:
            # Unresolved, so that an interpolation (`${study.name}-v2`) sees the profile's values.
            OmegaConf.update(merged, key, value, merge=False)
    suffix = debug.get("study_suffix") or ""
    if suffix and not str(merged.study.name).endswith(suffix):
        merged.study.name = f"{merged.study.name}{suffix}"
    return merged


def _dotted(container: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(container, dict) or part not in container:
            return _ABSENT
        container = container[part]
    return container


def _family_overrides(cfg: DictConfig) -> dict[str, Any]:
    """The debug profile's `model_overrides` for the configured model family, if any."""
    debug = cfg.get("debug")
    by_family = (debug.get("model_overrides") or {}) if debug else {}
    chosen = by_family.get(str(cfg.model.get("family")))
    return OmegaConf.to_container(chosen) if chosen else {}  # type: ignore[return-value]


def debug_profile_keys(cfg: DictConfig) -> set[str]:
    """The dotted keys the selected debug profile sets (empty without one)."""
    debug = cfg.get("debug")
    overrides = OmegaConf.to_container(debug.get("overrides") or {}) if debug else {}
    assert isinstance(overrides, dict)
    family = _family_overrides(cfg)
    if family:
        overrides = {**overrides, "model": {**family, **overrides.get("model", {})}}

    def leaves(node: Any, prefix: str) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                yield from leaves(value, f"{prefix}{key}.")
        else:
            yield prefix.rstrip(".")

    return set(leaves(overrides, ""))


def resolve(cfg: DictConfig) -> DictConfig:
    """Resolve every interpolation, turning OmegaConf errors into ones that name the key."""
    try:
        resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        raise ConfigError(f"Invalid config: key '{key}': {exc.msg}") from None
    assert isinstance(resolved, DictConfig)
    for key in _REQUIRED:
        if OmegaConf.select(resolved, key, default=None) is None:
            raise ConfigError(f"Invalid config: key '{key}' must be set")
    return resolved


def search_space_sources(
    experiment: str | None, config_roots: Sequence[Path] = (CONF_DIR, ROOT)
) -> dict[str, str]:
    """Map each search-space key to the file that defines it, for error messages.

    Reads the experiment's defaults list the way Hydra merges it: later files win, and the
    experiment's own `search_space` node wins over the files it includes. `config_roots` is
    Hydra's search path (user config dirs included), searched in order.
    """
    sources: dict[str, str] = {}
    experiment_file = _first_file(config_roots, f"experiment/{experiment}.yaml")
    if not experiment or experiment_file is None:
        return sources
    content = yaml.safe_load(experiment_file.read_text()) or {}
    for entry in content.get("defaults") or []:
        name = entry if isinstance(entry, str) else next(iter(entry), "")
        if not isinstance(name, str) or not name.startswith("/search_spaces/"):
            continue
        file = _first_file(config_roots, f"{name.lstrip('/').split('@')[0]}.yaml")
        if file is not None:
            for key in yaml.safe_load(file.read_text()) or {}:
                sources[key] = _relative(file)
    for key in content.get("search_space") or {}:
        sources[key] = _relative(experiment_file)
    return sources


def _first_file(roots: Sequence[Path], relative: str) -> Path | None:
    return next((root / relative for root in roots if (root / relative).is_file()), None)


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def load_search_space(
    cfg: DictConfig, sources: Mapping[str, str], pinned: Collection[str] = ()
) -> SearchSpace:
    """The config's search space, less the keys `pinned` on the command line.

    `python -m tuner +experiment=bert_ffn model.ffn_width=1024` fixes the width for every
    trial instead of searching it, which is also how a chosen trial is retrained exactly.
    """
    space: Mapping[str, Any] = cfg.get("search_space") or {}
    searched = {key: value for key, value in space.items() if key not in pinned}
    result = build_search_space(searched, cfg, sources)
    for key in space:
        if key in pinned:
            result.fixed[key] = OmegaConf.select(cfg, key)
    return result


def with_params(cfg: DictConfig, params: Mapping[str, Any]) -> DictConfig:
    """A copy of `cfg` with dotted keys set to a trial's values."""
    trial_cfg = cfg.copy()
    for key, value in params.items():
        OmegaConf.update(trial_cfg, key, value, merge=False)
    return trial_cfg
