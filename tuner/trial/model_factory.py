"""The models trials start from: the loaded model built once per model config and copied for each
trial (`ModelFactory`), then edited and initialised, or cut from the study's teacher
(`untrained_model`)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from tuner.edits import apply_edits, architecture_of, edit_keys
from tuner.models import build_model
from tuner.training import initialise_new_layers
from tuner.trial.students import student_of


def untrained_model(
    cfg: DictConfig,
    build: Callable[[], nn.Module],
    teacher: nn.Module | None = None,
    inputs: Sequence[tuple[torch.Tensor, ...]] | None = None,
) -> nn.Module:
    """A trial's model before training: `build`'s (the loaded model) edited and its new layers
    initialised, or the student of `teacher` (`tuner.trial.students.student_of`); the global
    generator seeded with `train.seed` either way, since training's dropout draws from it next.
    `inputs`: batches of training inputs, on which the edits that measure what to keep measure
    it (without them, only the edited shapes are right: for timing an architecture)."""
    seed = int(cfg.train.seed)
    if teacher is not None:
        model = student_of(teacher, cfg.model, build, inputs)
        torch.manual_seed(seed)
        return model
    model = build()
    torch.manual_seed(seed)
    apply_edits(model, cfg.model, inputs)
    initialise_new_layers(model.new_layers(), str(cfg.train.init))
    return model


class ModelFactory:
    """Builds the base model once per model config and hands out copies.

    Loading pretrained weights costs seconds; structural edits only change keys that the cache
    ignores, so most trials start from a copy of one loaded model.
    """

    def __init__(self, num_labels: int) -> None:
        self.num_labels = num_labels
        self._key: str | None = None
        self._model: nn.Module | None = None

    def build(self, model_cfg: DictConfig, seed: int) -> nn.Module:
        return copy.deepcopy(self._base(model_cfg, seed))

    def architecture(self, model_cfg: DictConfig, seed: int) -> dict[str, Any]:
        """The absolute edits of the model `model_cfg` deploys (`architecture_of`); read off
        the cached model, which it does not change, so nothing is copied."""
        return architecture_of(self._base(model_cfg, seed), model_cfg)

    def _base(self, model_cfg: DictConfig, seed: int) -> nn.Module:
        values = OmegaConf.to_container(model_cfg)
        assert isinstance(values, dict)
        edited = edit_keys()
        key = json.dumps(
            {"seed": seed, **{k: v for k, v in values.items() if k not in edited}},
            sort_keys=True,
            default=str,
        )
        if key != self._key or self._model is None:
            # Seeded on its own, so a random-init model is the same whether it is built first in
            # a process or copied from the cache (a retraining run builds it fresh).
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                self._model = build_model(model_cfg, self.num_labels)
            self._key = key
        return self._model
