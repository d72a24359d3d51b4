"""Seeded train/validation/test split; the search only ever sees train and validation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig

from tuner.data.sources import DATA_SOURCES, RawTexts
from tuner.errors import ConfigError


@dataclass(frozen=True)
class TextExamples:
    texts: list[str]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class TextSplits:
    train: TextExamples
    val: TextExamples
    test: TextExamples
    label_names: list[str]
    origin: str

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


def load_splits(data_cfg: DictConfig) -> TextSplits:
    """Load the configured source and split it deterministically by `data.split_seed`."""
    raw = DATA_SOURCES.get(data_cfg.source)(data_cfg)
    return split(raw, data_cfg)


def split(raw: RawTexts, data_cfg: DictConfig) -> TextSplits:
    _check_fractions(data_cfg)
    if len(raw.texts) != len(raw.labels):
        raise ConfigError(f"Invalid data in {raw.origin}: texts and labels differ in length")
    label_names = sorted({str(label) for label in raw.labels})
    if len(label_names) < 2:
        raise ConfigError(
            f"Invalid data in {raw.origin}: need at least 2 label values, found {label_names}"
        )
    index_of = {name: i for i, name in enumerate(label_names)}
    labels = [index_of[str(label)] for label in raw.labels]

    order = np.random.default_rng(data_cfg.split_seed).permutation(len(raw.texts))
    n_test = int(round(len(order) * data_cfg.test_fraction))
    n_val = int(round(len(order) * data_cfg.val_fraction))
    if n_val == 0 or len(order) - n_test - n_val < 2:
        raise ConfigError(
            f"Invalid data in {raw.origin}: {len(order)} examples are too few for "
            f"data.val_fraction={data_cfg.val_fraction} and "
            f"data.test_fraction={data_cfg.test_fraction}"
        )
    test_idx = order[:n_test]
    val_idx = order[n_test : n_test + n_val][: data_cfg.max_val_samples]
    train_idx = order[n_test + n_val :][: data_cfg.max_train_samples]

    def take(indices: np.ndarray) -> TextExamples:
        return TextExamples([raw.texts[i] for i in indices], [labels[i] for i in indices])

    return TextSplits(take(train_idx), take(val_idx), take(test_idx), label_names, raw.origin)


def _check_fractions(data_cfg: DictConfig) -> None:
    for key in ("val_fraction", "test_fraction"):
        value = data_cfg[key]
        if not 0 <= value < 1:
            raise ConfigError(f"Invalid config: key 'data.{key}' must be in [0, 1), got {value}")
    if data_cfg.val_fraction + data_cfg.test_fraction >= 1:
        raise ConfigError(
            "Invalid config: keys 'data.val_fraction' + 'data.test_fraction' must be below 1"
        )
    for key in ("max_train_samples", "max_val_samples"):
        value = data_cfg.get(key)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(
                f"Invalid config: key 'data.{key}' must be a positive int or null, got {value!r}"
            )
