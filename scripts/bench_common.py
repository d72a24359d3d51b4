"""What the training benchmarks share: the study's data composed as `python -m tuner` would
compose it, one model built and trained as a trial does, and a median [range] cell.

Imported by scripts in this directory (run as `python scripts/NAME.py`, which puts it first on
the path)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from tuner.config import SearchSpace, apply_debug, compose_config, resolve
from tuner.data import Encoded, Splits, load_splits
from tuner.modalities import Modality
from tuner.models import build_model
from tuner.study import modality_for
from tuner.tracking import override_keys
from tuner.training import Distillation, TrainResult, batch_loss, train
from tuner.trial import untrained_model


@dataclass(frozen=True)
class StudyData:
    cfg: DictConfig
    splits: Splits
    modality: Modality
    train_data: Encoded
    val_data: Encoded


def study_data(overrides: list[str]) -> StudyData:
    """The composed config (a debug profile such as `debug=smoke` shrinks it as it shrinks
    `python -m tuner`) and its data, encoded once."""
    cfg = resolve(apply_debug(compose_config(overrides), override_keys(overrides)))
    splits = load_splits(cfg.data)
    modality = modality_for(cfg, SearchSpace(), splits)
    train_data = modality.encode(splits.train.items, splits.train.labels)
    val_data = modality.encode(splits.val.items, splits.val.labels)
    return StudyData(cfg, splits, modality, train_data, val_data)


def train_as_a_trial(
    cfg: DictConfig,
    data: StudyData,
    seed: int,
    train_data: Encoded | None = None,
    distillation: Distillation | None = None,
    teacher: torch.nn.Module | None = None,
) -> tuple[torch.nn.Module, TrainResult, float]:
    """The model of `cfg` built, edited, initialised and trained with `seed` as `tuner.trial`
    does it (on `train_data`, the study's by default); with its training seconds. Given a
    `teacher`, the model starts from its weights (`train.distill.start_from=teacher`)."""
    cfg = cfg.copy()
    cfg.train.seed = seed
    train_cfg = cfg.train
    num_labels = data.splits.num_labels

    def build() -> torch.nn.Module:
        # Seeded on its own, as the study's model cache builds it.
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return build_model(cfg.model, num_labels)

    model = untrained_model(cfg, build, teacher)
    started = time.perf_counter()
    result = train(
        model,
        data.train_data if train_data is None else train_data,
        data.val_data,
        train_cfg,
        batch_loss(data.modality.name, train_cfg, num_labels),
        distillation=distillation,
    )
    return model, result, time.perf_counter() - started


def spread(values: list[float], digits: int) -> str:
    """`median [lowest-highest]`."""
    return (
        f"{statistics.median(values):.{digits}f} "
        f"[{min(values):.{digits}f}-{max(values):.{digits}f}]"
    )
