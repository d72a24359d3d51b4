"""Optuna samplers by name (`study.sampler`), given a seed and the study's constraints."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import optuna

from tuner.registry import Registry

ConstraintsFunc = Callable[[optuna.trial.FrozenTrial], Sequence[float]] | None
SamplerFactory = Callable[[int, ConstraintsFunc], optuna.samplers.BaseSampler]

SAMPLERS: Registry[SamplerFactory] = Registry("study.sampler")
# The constant liar treats trials running in other workers as bad, so that parallel workers
# spread out instead of sampling next to each other; alone, a worker has none running.
SAMPLERS.register("tpe")(
    lambda seed, constraints: optuna.samplers.TPESampler(
        seed=seed, multivariate=True, constraints_func=constraints, constant_liar=True
    )
)
SAMPLERS.register("nsga2")(
    lambda seed, constraints: optuna.samplers.NSGAIISampler(seed=seed, constraints_func=constraints)
)
# Random search ignores constraints; the front still marks infeasible points.
SAMPLERS.register("random")(lambda seed, constraints: optuna.samplers.RandomSampler(seed=seed))
