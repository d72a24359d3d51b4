"""`python -m tuner +experiment=NAME [overrides]`: run or resume the experiment's study."""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from tuner.config import CONF_DIR, register_resolvers, search_space_sources
from tuner.errors import ConfigError, StudyStopped
from tuner.interrupts import Terminated, interruptible
from tuner.quick_exit import quick_exit
from tuner.secrets import mask_urls_in
from tuner.study import choose_an_experiment, experiments, help_text

register_resolvers()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    from tuner.study import run_study

    hydra_cfg = HydraConfig.get()
    runtime = hydra_cfg.runtime
    roots = [Path(s.path) for s in runtime.config_sources if s.schema == "file"]
    try:
        # From the first step, so that a stop during start-up (reading data, measuring the
        # machine) ends the same way as one during a trial.
        with interruptible():
            run_study(
                cfg,
                sources=search_space_sources(runtime.choices.get("experiment"), roots),
                overrides=list(hydra_cfg.overrides.task),
            )
    except ConfigError as exc:
        print(f"error: {mask_urls_in(str(exc))}", file=sys.stderr)
        sys.exit(2)
    except StudyStopped as exc:
        print(f"error: {mask_urls_in(str(exc))}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt as interrupt:
        print(
            "Interrupted: the running trial is marked failed and queued again, its MLflow runs "
            "KILLED; re-run the same command to resume.",
            file=sys.stderr,
        )
        # The shell's convention: 128 + the signal's number.
        sys.exit(143 if isinstance(interrupt, Terminated) else 130)
    except Exception as exc:
        # Reported here rather than by Hydra, which prints the command line's overrides as
        # typed, a password in `study.storage` or `tracking.uri` included.
        print(mask_urls_in("".join(traceback.format_exception(exc))), file=sys.stderr)
        sys.exit(1)


_EXPERIMENT = re.compile(r"^\+{0,2}experiment=(.*)$")
# Hydra's own flags that run no study, so need no experiment.
_NO_STUDY_FLAGS = (
    "--help",
    "-h",
    "--hydra-help",
    "--info",
    "-i",
    "--version",
    "--cfg",
    "-c",
    "--shell-completion",
    "-sc",
)
# Ways to put configs where this check does not look; Hydra then decides alone.
_OTHER_CONFIG_SOURCES = ("--config-path", "-cp", "hydra.searchpath")


def _config_dirs(argv: Sequence[str]) -> list[Path]:
    """User config directories given with --config-dir/-cd, where experiments may live too."""
    dirs = []
    for index, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and index + 1 < len(argv):
            dirs.append(Path(argv[index + 1]))
        elif arg.startswith(("--config-dir=", "-cd=")):
            dirs.append(Path(arg.split("=", 1)[1]))
    return dirs


def check_experiment(argv: Sequence[str]) -> str | None:
    """The message for a command line that names no experiment, or one that does not exist;
    None when the experiment is there, or when Hydra alone can tell (a command that runs no
    study, configs from elsewhere, a sweep expression such as `choice(...)` or `glob(...)`)."""
    if any(arg.split("=", 1)[0] in _NO_STUDY_FLAGS for arg in argv):
        return None
    named = [m.group(1) for m in map(_EXPERIMENT.match, argv) if m]
    dirs = _config_dirs(argv)
    if not named:
        return choose_an_experiment(dirs)
    if any(arg.split("=", 1)[0].lstrip("+") in _OTHER_CONFIG_SOURCES for arg in argv):
        return None
    if "(" in named[-1]:
        return None
    known = experiments(dirs)
    # A multirun sweeps `+experiment=a,b`: each must exist.
    for name in named[-1].split(","):
        if name not in known:
            return choose_an_experiment(dirs, unknown=name)
    return None


if __name__ == "__main__":
    with quick_exit():
        argv = sys.argv[1:]
        problem = check_experiment(argv)
        if problem:
            print(problem, file=sys.stderr)
            sys.exit(2)
        try:
            main()
        finally:
            # Hydra exits once it has printed its help; what is here comes after it.
            if "--help" in argv or "-h" in argv:
                print(help_text(_config_dirs(argv)))
