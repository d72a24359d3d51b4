"""The hypervolume logged after every trial: feasible points only, one reference per study."""

from __future__ import annotations

import optuna
import pytest
from omegaconf import OmegaConf

from tuner.constraints import Constraints
from tuner.convergence import REFERENCE_ATTR, convergence
from tuner.front import study_points
from tuner.pareto import hypervolume

FIXED_LATENCY = OmegaConf.create({"val_accuracy": 0.5, "latency_ms_p50": None})


def _study(points: list[tuple[float, float, float]]) -> optuna.Study:
    """Points as (val_accuracy, latency, eager accuracy of the trained model)."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    for accuracy, latency, reference in points:
        study.add_trial(
            optuna.trial.create_trial(
                values=[accuracy, latency], user_attrs={"reference_accuracy": reference}
            )
        )
    return study


def test_reference_is_fixed_by_the_first_points_and_kept():
    study = _study([(0.8, 10.0, 0.8), (0.7, 5.0, 0.8)])
    first = convergence(study, FIXED_LATENCY, study_points(study))
    assert first.reference == (0.5, 20.0)  # twice the slowest point so far
    assert study.user_attrs[REFERENCE_ATTR] == [0.5, 20.0]
    assert first.hypervolume == pytest.approx(hypervolume([(0.8, 10.0), (0.7, 5.0)], (0.5, 20.0)))
    # A slower point later does not move the reference: the curve stays comparable.
    study.add_trial(
        optuna.trial.create_trial(values=[0.9, 50.0], user_attrs={"reference_accuracy": 0.9})
    )
    later = convergence(study, FIXED_LATENCY, study_points(study))
    assert later.reference == (0.5, 20.0) and later.hypervolume == first.hypervolume


def test_infeasible_points_add_no_hypervolume():
    study = _study([(0.80, 10.0, 0.80), (0.60, 2.0, 0.80)])
    # Within 0.05 of the best model: the fast, inaccurate point is infeasible.
    points = study_points(study, Constraints(max_accuracy_drop=0.05))
    assert [p.feasible for p in points] == [True, False]
    progress = convergence(
        study, OmegaConf.create({"val_accuracy": 0.0, "latency_ms_p50": 30.0}), points
    )
    assert progress.hypervolume == pytest.approx((30.0 - 10.0) * 0.80)
    assert progress.metrics() == {"hypervolume": progress.hypervolume, "pareto_points": 1.0}


def test_no_points_no_reference():
    study = _study([])
    assert convergence(study, FIXED_LATENCY, []) is None
    assert REFERENCE_ATTR not in study.user_attrs
