"""Texts served through the model's own tokenizer, as `tokenizers` reads it from the
`tokenizer.json` that `tuner.modalities` saved, set up as transformers sets it up for a call
with `padding="max_length", truncation=True` (so the token ids equal training's)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tuner.serving.inputs import BATCH_SIZE, SERVING_INPUTS, InputBatch, ServingInputs

TEXT_COLUMN = "text"
TEXT_SETTINGS = "text_inputs.json"
_TOKENIZER_FILE = "tokenizer.json"
_TOKENIZER_CONFIG = "tokenizer_config.json"


@SERVING_INPUTS.register("text")
class ServingTexts(ServingInputs):
    packages = ("tokenizers",)

    def __init__(self, tokenizer, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length

    @classmethod
    def load(cls, directory: Path) -> ServingTexts:
        from tokenizers import Tokenizer

        if not (directory / _TOKENIZER_FILE).exists():
            raise ValueError(
                f"{directory}: no {_TOKENIZER_FILE}; this model's tokenizer has no fast "
                "(tokenizers) form to serve it with"
            )
        max_length = int(json.loads((directory / TEXT_SETTINGS).read_text())["max_length"])
        config = json.loads((directory / _TOKENIZER_CONFIG).read_text())
        tokenizer = Tokenizer.from_file(str(directory / _TOKENIZER_FILE))
        tokenizer.enable_truncation(max_length, direction=config.get("truncation_side", "right"))
        pad_token = config["pad_token"]
        tokenizer.enable_padding(
            direction=config.get("padding_side", "right"),
            pad_id=tokenizer.token_to_id(pad_token),
            pad_type_id=int(config.get("pad_token_type_id", 0)),
            pad_token=pad_token,
            length=max_length,
        )
        return cls(tokenizer, max_length)

    def items_of(self, model_input: Any) -> list[str]:
        if isinstance(model_input, pd.DataFrame):
            if TEXT_COLUMN not in model_input.columns:
                raise ValueError(
                    f"expected a column '{TEXT_COLUMN}', got {list(model_input.columns)}"
                )
            return [str(t) for t in model_input[TEXT_COLUMN]]
        if isinstance(model_input, str):
            return [model_input]
        return [str(t) for t in model_input]

    def batches(self, items: Sequence[Any]) -> Iterator[InputBatch]:
        """Shortest texts first, each batch trimmed to its longest text (evaluation's
        `group_by_length`)."""
        encodings = self.tokenizer.encode_batch([str(item) for item in items])
        input_ids = np.array([e.ids for e in encodings], dtype=np.int64)
        attention_mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        lengths = attention_mask.sum(axis=1)
        order = np.argsort(lengths, kind="stable")
        for start in range(0, len(order), BATCH_SIZE):
            index = order[start : start + BATCH_SIZE]
            length = max(int(lengths[index].max()), 1)
            yield index, (input_ids[index, :length], attention_mask[index, :length])
