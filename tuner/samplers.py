"""Optuna samplers by name (`study.sampler`)."""

from __future__ import annotations

from collections.abc import Callable

import optuna

from tuner.registry import Registry

SAMPLERS: Registry[Callable[[int], optuna.samplers.BaseSampler]] = Registry("study.sampler")
SAMPLERS.register("tpe")(lambda seed: optuna.samplers.TPESampler(seed=seed, multivariate=True))
SAMPLERS.register("nsga2")(lambda seed: optuna.samplers.NSGAIISampler(seed=seed))
SAMPLERS.register("random")(lambda seed: optuna.samplers.RandomSampler(seed=seed))
