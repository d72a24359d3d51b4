"""Optuna samplers by name (`study.sampler`), given a seed.

Constraints reach them through the trials themselves (`Trial.set_constraint`, Optuna's own place
for them), which TPE and NSGA-II read."""

from __future__ import annotations

from collections.abc import Callable

import optuna

from tuner.registry import Registry

SamplerFactory = Callable[[int], optuna.samplers.BaseSampler]

SAMPLERS: Registry[SamplerFactory] = Registry("study.sampler")
# The constant liar treats trials running in other workers as bad, so that parallel workers
# spread out instead of sampling next to each other; alone, a worker has none running.
SAMPLERS.register("tpe")(
    lambda seed: optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
)
SAMPLERS.register("nsga2")(lambda seed: optuna.samplers.NSGAIISampler(seed=seed))
# Random search ignores constraints; the front still marks infeasible points.
SAMPLERS.register("random")(lambda seed: optuna.samplers.RandomSampler(seed=seed))
# Gaussian-process Bayesian optimisation; reads constraints and both objectives.
SAMPLERS.register("gp")(lambda seed: optuna.samplers.GPSampler(seed=seed))
