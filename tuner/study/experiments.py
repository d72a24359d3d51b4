"""What a new user can run: the experiments (`conf/experiment/*.yaml`, and those of any
`--config-dir`), the search-space files, and the backends this machine runs, each with its
one-line description, for the messages of `python -m tuner` without an experiment and `--help`."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from pathlib import Path

from tuner.config import CONF_DIR, SEARCH_SPACE_DIR

_EXAMPLES = (
    "python -m tuner +experiment=bert_ffn debug=smoke    a tiny run, well under a minute",
    "python -m tuner +experiment=bert_ffn                run or resume the study",
)


def description(path: Path) -> str:
    """The first sentence of a YAML file's leading comment block (after `# @package ...`)."""
    lines = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            break
        text = stripped.lstrip("#").strip()
        if not text.startswith("@package"):
            lines.append(text)
    joined = " ".join(line for line in lines if line)
    first = re.split(r"(?<=\.)\s", joined, maxsplit=1)[0]
    return first or "(no description)"


def experiments(config_dirs: Sequence[Path] = ()) -> dict[str, str]:
    """Experiment name -> description; a user `--config-dir` may add or shadow experiments."""
    found: dict[str, str] = {}
    for root in [CONF_DIR, *config_dirs]:
        folder = root / "experiment"
        # Nested files are named by their path: `+experiment=team/mine`.
        for path in sorted(folder.rglob("*.yaml")):
            found[path.relative_to(folder).with_suffix("").as_posix()] = description(path)
    return dict(sorted(found.items()))


def search_space_files() -> dict[str, str]:
    return {path.stem: description(path) for path in sorted(SEARCH_SPACE_DIR.glob("*.yaml"))}


def _listing(entries: dict[str, str], indent: str = "  ") -> list[str]:
    width = max((len(name) for name in entries), default=0)
    return [f"{indent}{name:<{width}}  {text}" for name, text in entries.items()]


def choose_an_experiment(config_dirs: Sequence[Path] = (), unknown: str | None = None) -> str:
    """The message for a run without an experiment, or with one that does not exist."""
    known = experiments(config_dirs)
    if unknown is None:
        head = "error: choose an experiment with +experiment=NAME. The experiments:"
    else:
        close = difflib.get_close_matches(unknown, list(known), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        head = f"error: no experiment '{unknown}'.{hint} The experiments:"
    return "\n".join([head, *_listing(known), "For example:", *(f"  {e}" for e in _EXAMPLES)])


def help_text(config_dirs: Sequence[Path] = ()) -> str:
    """What `python -m tuner --help` adds to Hydra's help: experiments, search-space files and
    the backends this machine runs (and why the others are left out)."""
    from tuner.deploy import BACKENDS, unavailable_backends

    left_out = unavailable_backends(BACKENDS.names())
    runnable = {
        name: f"deploys {' and '.join(sorted(BACKENDS.get(name).modalities))} models"
        for name in BACKENDS.names()
        if name not in left_out
    }
    lines = ["Experiments (+experiment=NAME):", *_listing(experiments(config_dirs))]
    lines += ["", "Search-space files (search_spaces/, composed by experiments):"]
    lines += _listing(search_space_files())
    lines += [
        "",
        "Backends this machine runs (deploy every trained model on some of them with "
        "deploy.backends=[NAME,...]):",
        *_listing(runnable),
    ]
    if left_out:
        lines += ["Backends this machine cannot run:", *_listing(left_out)]
    return "\n".join(lines)
