"""One trial: sample, build, edit, initialise, train, validate, deploy, time, record."""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import torch
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from torch import nn

from tuner import console
from tuner.backends import BACKENDS, ExampleInputs
from tuner.config import with_params
from tuner.data.tokens import TokenizedTexts
from tuner.edits import apply_edits
from tuner.latency import LatencyProtocol, measure_latency
from tuner.models import build_model
from tuner.space import SearchSpace
from tuner.tracking import Tracker
from tuner.training import initialise_new_layers, train

_SUGGEST = {
    FloatDistribution: lambda trial, name, d: trial.suggest_float(
        name, d.low, d.high, step=d.step, log=d.log
    ),
    IntDistribution: lambda trial, name, d: trial.suggest_int(
        name, d.low, d.high, step=d.step, log=d.log
    ),
    CategoricalDistribution: lambda trial, name, d: trial.suggest_categorical(name, d.choices),
}


def suggest(trial: optuna.Trial, space: Mapping[str, BaseDistribution]) -> dict[str, Any]:
    return {name: _SUGGEST[type(d)](trial, name, d) for name, d in space.items()}


class ModelFactory:
    """Builds the base model once per model config and hands out copies.

    Loading pretrained weights costs seconds; structural edits only change keys that the cache
    ignores, so most trials start from a copy of one loaded model.
    """

    def __init__(self, num_labels: int, edit_keys: set[str]) -> None:
        self.num_labels = num_labels
        self.edit_keys = edit_keys
        self._key: str | None = None
        self._model: nn.Module | None = None

    def build(self, model_cfg: DictConfig) -> nn.Module:
        base = {
            k: v for k, v in OmegaConf.to_container(model_cfg).items() if k not in self.edit_keys
        }
        key = json.dumps(base, sort_keys=True, default=str)
        if key != self._key or self._model is None:
            self._model = build_model(model_cfg, self.num_labels)
            self._key = key
        return copy.deepcopy(self._model)


@dataclass
class TrialContext:
    """Everything trials share within one invocation."""

    cfg: DictConfig
    space: SearchSpace
    train_data: TokenizedTexts
    val_data: TokenizedTexts
    example: ExampleInputs
    protocol: LatencyProtocol
    factory: ModelFactory
    tracker: Tracker
    parent_run_id: str
    n_trials: int


class Objective:
    """Optuna's objective: returns (val_accuracy, latency_ms_p50) for one trial."""

    def __init__(self, context: TrialContext) -> None:
        self.context = context
        self.started = 0

    def __call__(self, trial: optuna.Trial) -> tuple[float, float]:
        ctx = self.context
        self.started += 1
        params = suggest(trial, ctx.space.distributions)
        cfg = with_params(ctx.cfg, params)
        backend = str(cfg.deploy.backend)
        trial.set_user_attr("deploy.backend", backend)
        console.trial_header(self.started, ctx.n_trials, trial.number, params)
        run_id = ctx.tracker.start_trial(
            ctx.parent_run_id,
            str(cfg.study.name),
            trial.number,
            backend,
            {**ctx.space.fixed, **params, **ctx.protocol.record(prefix="latency.")},
        )
        trial.set_user_attr("mlflow_run_id", run_id)
        try:
            values = self._run(cfg, backend, run_id)
        except KeyboardInterrupt:
            ctx.tracker.kill(run_id)
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            trial.set_user_attr("fail_reason", reason)
            ctx.tracker.fail(run_id, reason)
            console.trial_failed(trial.number, reason, exc)
            raise
        for name in ("latency_ms_p95", "model_size_mb"):
            trial.set_user_attr(name, values[name])
        ctx.tracker.finish(run_id)
        console.trial_result(values)
        return values["val_accuracy"], values["latency_ms_p50"]

    def _run(self, cfg: DictConfig, backend_name: str, run_id: str) -> dict[str, float]:
        ctx = self.context
        torch.manual_seed(int(cfg.train.seed))
        model = ctx.factory.build(cfg.model)
        apply_edits(model, cfg.model)
        initialise_new_layers(model.new_layers(), str(cfg.train.init))

        def log_epoch(result):
            ctx.tracker.log_metrics(
                run_id,
                {"train_loss": result.train_loss, "val_accuracy": result.val_accuracy},
                step=result.epoch,
            )

        with console.training_progress("training") as progress:
            task = progress.add_task("training", total=None)
            trained = train(
                model,
                ctx.train_data,
                ctx.val_data,
                cfg.train,
                on_step=lambda done, total: progress.update(task, completed=done, total=total),
                on_epoch=log_epoch,
            )
        with tempfile.TemporaryDirectory() as workdir:
            deployed = BACKENDS.get(backend_name).convert(model, ctx.example, Path(workdir))
            latency = measure_latency(deployed.logits_of, ctx.example, ctx.protocol)
            size_mb = deployed.size_mb
        values = {
            "val_accuracy": trained.val_accuracy,
            "latency_ms_p50": latency.p50_ms,
            "latency_ms_p95": latency.p95_ms,
            "model_size_mb": size_mb,
            "train_seconds": trained.seconds,
            "num_parameters": float(sum(p.numel() for p in model.parameters())),
        }
        # val_accuracy is already logged once per epoch; its last value is the final one.
        final = {k: v for k, v in values.items() if k != "val_accuracy"}
        ctx.tracker.log_metrics(run_id, final, step=len(trained.epochs))
        return values
