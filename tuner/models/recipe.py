"""How to rebuild a trained model's architecture, structural edits included.

PyTorch artifacts ship their weights as plain tensors (safetensors, or a state dict read with
`torch.load(weights_only=True)`) together with this recipe, never as a pickled module, so
loading an artifact cannot run code it carries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from torch import nn

from tuner.edits import apply_edits
from tuner.models.base import build_model


@dataclass(frozen=True)
class ModelRecipe:
    """The `model` config the model was built from (edits included) and its label count."""

    model: dict[str, Any]
    num_labels: int

    @classmethod
    def of(cls, model_cfg: DictConfig, num_labels: int) -> ModelRecipe:
        container = OmegaConf.to_container(model_cfg, resolve=True)
        assert isinstance(container, dict)
        return cls(model=container, num_labels=num_labels)

    def to_json(self) -> str:
        return json.dumps({"model": self.model, "num_labels": self.num_labels}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelRecipe:
        values = json.loads(text)
        return cls(model=values["model"], num_labels=int(values["num_labels"]))

    def build(self) -> nn.Module:
        """The architecture with fresh weights, ready for an artifact's state dict; nothing
        pretrained is read, since every weight comes from the artifact."""
        cfg = OmegaConf.create({**self.model, "random_init": True})
        model = build_model(cfg, self.num_labels)
        apply_edits(model, cfg)
        return model.eval()
