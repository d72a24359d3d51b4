"""Any Hugging Face encoder (BERT, MiniLM, RoBERTa, ...) with a pooled classification head."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.errors import ConfigError
from tuner.models.base import MODEL_FAMILIES, ModelFamily, NewLayer
from tuner.models.packaged import resolve_name_or_path

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "gelu": nn.GELU,
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "silu": nn.SiLU,
}


class ClassificationHead(nn.Module):
    """dropout -> dense -> activation -> dropout -> out, as RoBERTa's head."""

    def __init__(self, hidden_size: int, num_labels: int, activation: str, dropout: float) -> None:
        super().__init__()
        self.activation_name = activation
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = _ACTIVATIONS[activation]()
        self.out = nn.Linear(hidden_size, num_labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        hidden = self.activation(self.dense(self.dropout(pooled)))
        return self.out(self.dropout(hidden))


class SequenceClassifier(nn.Module):
    """An encoder, a pooling of its token states, and a freshly initialised head."""

    def __init__(
        self,
        encoder: PreTrainedModel,
        num_labels: int,
        pooling: str,
        head_activation: str,
        dropout: float,
        encoder_is_new: bool,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling
        self.encoder_is_new = encoder_is_new
        self.head = ClassificationHead(
            encoder.config.hidden_size, num_labels, head_activation, dropout
        )

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pooling == "cls":
            return states[:, 0]
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.head(pooled)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.classify(self.embed(input_ids, attention_mask))

    def new_layers(self) -> list[NewLayer]:
        layers = [
            NewLayer("head.dense", self.head.dense, self.head.activation_name),
            NewLayer("head.out", self.head.out, "linear"),
        ]
        if self.encoder_is_new:
            hidden_act = str(getattr(self.encoder.config, "hidden_act", "linear"))
            for name, module in self.encoder.named_modules():
                if isinstance(module, nn.Linear):
                    # In BERT-style blocks only the FFN's first projection feeds an activation.
                    activation = hidden_act if name.endswith("intermediate.dense") else "linear"
                    layers.append(NewLayer(f"encoder.{name}", module, activation))
        return layers


def _check(model_cfg: DictConfig) -> None:
    if model_cfg.pooling not in ("mean", "cls"):
        raise ConfigError(
            f"Invalid config: key 'model.pooling': '{model_cfg.pooling}'; choose mean or cls"
        )
    if model_cfg.head_activation not in _ACTIVATIONS:
        raise ConfigError(
            f"Invalid config: key 'model.head_activation': '{model_cfg.head_activation}'; "
            f"choose one of {', '.join(_ACTIVATIONS)}"
        )


def build_hf_encoder(model_cfg: DictConfig, num_labels: int) -> nn.Module:
    # transformers' model classes take seconds to import: only where an encoder is built.
    from transformers import AutoConfig, AutoModel

    _check(model_cfg)
    source = resolve_name_or_path(str(model_cfg.name_or_path))
    overrides = dict(model_cfg.get("config_overrides") or {})
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=False, **overrides)
        if model_cfg.random_init:
            encoder = AutoModel.from_config(config, trust_remote_code=False)
        else:
            encoder = AutoModel.from_pretrained(source, config=config, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"Invalid config: key 'model.name_or_path': cannot load '{model_cfg.name_or_path}': "
            f"{str(exc).splitlines()[0]}"
        ) from None
    return SequenceClassifier(
        encoder,
        num_labels,
        pooling=model_cfg.pooling,
        head_activation=model_cfg.head_activation,
        dropout=float(model_cfg.dropout),
        encoder_is_new=bool(model_cfg.random_init),
    )


# The tokenizer comes from name_or_path.
MODEL_FAMILIES.register("hf_encoder")(
    ModelFamily(
        build=build_hf_encoder,
        modality="text",
        input_keys=("name_or_path",),
        layer_stack=True,
    )
)
