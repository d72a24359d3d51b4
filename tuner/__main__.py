"""`python -m tuner +experiment=NAME [overrides]`: run or resume the experiment's study."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from tuner.config import CONF_DIR, register_resolvers, search_space_sources
from tuner.errors import ConfigError
from tuner.recovery import Terminated

register_resolvers()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    from tuner.study import run_study

    hydra_cfg = HydraConfig.get()
    runtime = hydra_cfg.runtime
    roots = [Path(s.path) for s in runtime.config_sources if s.schema == "file"]
    try:
        run_study(
            cfg,
            sources=search_space_sources(runtime.choices.get("experiment"), roots),
            overrides=list(hydra_cfg.overrides.task),
        )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as interrupt:
        print(
            "Interrupted: the running trial is marked failed and queued again, its MLflow runs "
            "KILLED; re-run the same command to resume.",
            file=sys.stderr,
        )
        # The shell's convention: 128 + the signal's number.
        sys.exit(143 if isinstance(interrupt, Terminated) else 130)


if __name__ == "__main__":
    main()
