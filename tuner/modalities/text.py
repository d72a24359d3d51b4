"""Text: the model's own tokenizer, padding to `data.max_length`; served from a `text` column."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, Schema
from omegaconf import DictConfig

from tuner.config import SearchSpace, candidate_values
from tuner.data import ExampleInputs, Splits, TokenizedTexts, tokenize_texts
from tuner.errors import ConfigError
from tuner.latency import LatencyProtocol
from tuner.modalities.base import MODALITIES, Modality
from tuner.serving import TEXT_COLUMN, TEXT_SETTINGS


@MODALITIES.register("text")
class TextModality(Modality):
    name = "text"

    def __init__(self, tokenizer, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length

    @classmethod
    def from_config(cls, cfg: DictConfig, splits: Splits) -> TextModality:
        from transformers import AutoTokenizer

        from tuner.models import resolve_name_or_path

        source = resolve_name_or_path(str(cfg.model.get("name_or_path")))
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"Invalid config: key 'model.name_or_path': no tokenizer at '{source}': {exc}"
            ) from None
        return cls(tokenizer, int(cfg.data.max_length))

    @staticmethod
    def check(cfg: DictConfig, space: SearchSpace) -> None:
        searched = space.distributions.get("train.cutmix_alpha")
        values = (
            candidate_values(searched)
            if searched is not None
            else [cfg.train.get("cutmix_alpha", 0)]
        )
        if any(float(value) > 0 for value in values):
            raise ConfigError(
                "Invalid config: key 'train.cutmix_alpha': cutmix cuts and pastes image "
                "patches; text models take train.mixup_alpha only (set train.cutmix_alpha=0)"
            )

    def encode(self, items: Sequence[Any], labels: Sequence[int] | None = None) -> TokenizedTexts:
        return tokenize_texts(
            self.tokenizer, list(items), self.max_length, None if labels is None else list(labels)
        )

    def example(self, items: Sequence[Any], protocol: LatencyProtocol) -> ExampleInputs:
        """Real texts, padded to the protocol's fixed sequence length."""
        batch = [str(items[i % len(items)]) for i in range(protocol.batch_size)]
        encoded = tokenize_texts(self.tokenizer, batch, protocol.seq_len)
        names = ("input_ids", "attention_mask")
        return ExampleInputs(
            (encoded.input_ids, encoded.attention_mask),
            names,
            {name: {0: "batch", 1: "sequence"} for name in names},
        )

    def save(self, directory: Path) -> None:
        self.tokenizer.save_pretrained(str(directory))
        (directory / TEXT_SETTINGS).write_text(json.dumps({"max_length": self.max_length}))

    @classmethod
    def load(cls, directory: Path) -> TextModality:
        from transformers import AutoTokenizer

        settings = json.loads((directory / TEXT_SETTINGS).read_text())
        return cls(AutoTokenizer.from_pretrained(str(directory)), int(settings["max_length"]))

    def signature(self) -> ModelSignature:
        return ModelSignature(
            inputs=Schema([ColSpec("string", TEXT_COLUMN)]),
            outputs=Schema([ColSpec("string", "label"), ColSpec("double", "score")]),
        )

    @staticmethod
    def serving_input(items: Sequence[Any]) -> pd.DataFrame:
        return pd.DataFrame({TEXT_COLUMN: [str(item) for item in items]})
