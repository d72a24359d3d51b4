"""What every trial of one invocation shares: the composed config, the data, the latency
protocol, the storage and tracker (`TrialContext`), and what a logged model ships with
(`ServingContext`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import torch
from omegaconf import DictConfig

from tuner.config import SearchSpace
from tuner.data import Encoded, ExampleInputs
from tuner.front import Constraints, PruningSettings
from tuner.insight import MachinePeak
from tuner.keys import BACKEND_KEY
from tuner.latency import LatencyProtocol, objective_name
from tuner.modalities import Modality
from tuner.store import LatencyTable, Leases, current_split
from tuner.tracking import Tracker
from tuner.trial.model_factory import ModelFactory
from tuner.trial.teacher import Teachers


@dataclass(frozen=True)
class ServingContext:
    """What a logged model ships besides its artifact, and how its points are retrained."""

    modality: Modality
    # Where the modality saved its input pipeline, shipped with every logged model.
    inputs_dir: Path
    label_names: list[str]
    example_items: Sequence[Any]
    # The invocation's command-line overrides and configured study name (before any suffix).
    overrides: tuple[str, ...]
    study_name: str
    profile_keys: frozenset[str] = frozenset()


@dataclass
class TrialContext:
    """Everything trials share within one invocation."""

    cfg: DictConfig
    space: SearchSpace
    backends: list[str]
    constraints: Constraints
    train_data: Encoded
    val_data: Encoded
    # Batches of training inputs for backends that calibrate activation ranges.
    calibration: list[tuple[torch.Tensor, ...]]
    example: ExampleInputs
    protocol: LatencyProtocol
    # The protocol, the machine and the input shape, recorded with every point.
    protocol_record: dict[str, Any]
    factory: ModelFactory
    tracker: Tracker
    parent_run_id: str
    n_trials: int
    storage: optuna.storages.BaseStorage
    study_id: int
    leases: Leases
    max_retry: int
    serving: ServingContext
    pruning: PruningSettings
    # The study's distillation teacher; None when no trial distils.
    teachers: Teachers | None = None
    # This machine's peaks (`tuner.insight.roofline`), against which points are held; None
    # where they could not be measured.
    peak: MachinePeak | None = None

    def study_trials(self) -> list[optuna.trial.FrozenTrial]:
        return self.storage.get_all_trials(self.study_id, deepcopy=False)

    def split_trials(self) -> list[optuna.trial.FrozenTrial]:
        """The study's trials made on its current data settings: the only ones whose points a
        trial is judged against (`tuner.store.data_settings`)."""
        study_attrs = self.storage.get_study_user_attrs(self.study_id)
        return current_split(self.study_trials(), study_attrs).trials

    @property
    def objective(self) -> str:
        """The latency objective's name (a point's metric), by the study's statistic."""
        return objective_name(self.protocol.statistic)

    @property
    def target_machine(self) -> str | None:
        """The machine whose latencies the study ranks by (`study.target_machine`); None: this
        worker's own."""
        target = self.cfg.study.get("target_machine")
        return None if target is None else str(target)

    def latency_table(self) -> LatencyTable:
        return LatencyTable.of_study(self.storage, self.study_id)

    def logged_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A point's MLflow params, but its backend (`Tracker.set_backend` logs that)."""
        logged = {**self.space.fixed, **params, **self.protocol_record}
        return {k: v for k, v in logged.items() if k != BACKEND_KEY}

    def add_trial(self, trial: optuna.trial.FrozenTrial) -> int:
        """Add a finished trial to the study and return its number."""
        trial_id = self.storage.create_new_trial(self.study_id, template_trial=trial)
        return self.storage.get_trial_number_from_id(trial_id)
