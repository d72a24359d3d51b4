"""Seeded train/validation/test split; the search only ever sees train and validation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from omegaconf import DictConfig

from tuner.data.sources import DATA_SOURCES, RawData
from tuner.errors import ConfigError


@dataclass(frozen=True)
class Examples:
    """Raw examples (texts, or an image array) and their label indices."""

    items: Sequence[Any]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class Splits:
    train: Examples
    val: Examples
    test: Examples
    label_names: list[str]
    origin: str
    # Which input pipeline reads the items (`tuner.modalities`).
    modality: str
    # What the source left out (`data.drop_empty`), told to the user.
    dropped: str | None = None

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


def load_splits(data_cfg: DictConfig) -> Splits:
    """Load the configured source and split it deterministically by `data.split_seed`."""
    raw = DATA_SOURCES.get(data_cfg.source)(data_cfg)
    return split(raw, data_cfg)


def _take(items: Sequence[Any], indices: np.ndarray) -> Sequence[Any]:
    if isinstance(items, np.ndarray):
        return items[indices]
    return [items[i] for i in indices]


def split(raw: RawData, data_cfg: DictConfig) -> Splits:
    _check_fractions(data_cfg)
    parts = [raw] if raw.test is None else [raw, raw.test]
    for part in parts:
        if len(part.items) != len(part.labels):
            raise ConfigError(
                f"Invalid data in {part.origin}: examples and labels differ in length"
            )
    label_names = sorted({str(label) for part in parts for label in part.labels})
    if len(label_names) < 2:
        raise ConfigError(
            f"Invalid data in {raw.origin}: need at least 2 label values, found {label_names}"
        )
    index_of = {name: i for i, name in enumerate(label_names)}

    def examples(part: RawData, indices: np.ndarray) -> Examples:
        return Examples(
            _take(part.items, indices), [index_of[str(part.labels[i])] for i in indices]
        )

    order = np.random.default_rng(data_cfg.split_seed).permutation(len(raw.items))
    # A source's own test set is kept whole; otherwise the test split is carved out first.
    n_test = 0 if raw.test is not None else int(round(len(order) * data_cfg.test_fraction))
    n_val = int(round(len(order) * data_cfg.val_fraction))
    if n_val == 0 or len(order) - n_test - n_val < 2:
        raise ConfigError(
            f"Invalid data in {raw.origin}: {len(order)} examples are too few for "
            f"data.val_fraction={data_cfg.val_fraction} and "
            f"data.test_fraction={data_cfg.test_fraction}"
        )
    val_idx = order[n_test : n_test + n_val][: data_cfg.max_val_samples]
    train_idx = order[n_test + n_val :][: data_cfg.max_train_samples]
    test = (
        examples(raw, order[:n_test])
        if raw.test is None
        else examples(raw.test, np.arange(len(raw.test.items)))
    )
    return Splits(
        examples(raw, train_idx),
        examples(raw, val_idx),
        test,
        label_names,
        raw.origin,
        raw.modality,
        raw.dropped,
    )


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
