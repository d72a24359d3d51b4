"""The hypervolume logged after every trial: feasible points only, one reference per study."""

from __future__ import annotations

import sys
from datetime import datetime

import optuna
import pytest
from omegaconf import OmegaConf

from tuner.front.constraints import Constraints
from tuner.front.convergence import convergence
from tuner.front.points import study_points
from tuner.keys import REFERENCE_ATTR

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
    # The staircase down to (0.5, 20): from 5 to 10 ms only the 0.7 point counts (height
    # 0.7 - 0.5), from 10 to 20 ms the 0.8 one (height 0.3): 5 x 0.2 + 10 x 0.3.
    assert first.hypervolume == pytest.approx(1.0 + 3.0)
    # A slower point later does not move the reference: the curve stays comparable. At 50 ms it
    # lies beyond the reference's 20 ms, so it adds nothing.
    study.add_trial(
        optuna.trial.create_trial(values=[0.9, 50.0], user_attrs={"reference_accuracy": 0.9})
    )
    later = convergence(study, FIXED_LATENCY, study_points(study))
    assert later.reference == (0.5, 20.0) and later.hypervolume == pytest.approx(4.0)
    # Nor does it push either earlier point off the front: three points, all on it.
    assert later.front_size == 3


def test_infeasible_points_add_no_hypervolume():
    study = _study([(0.80, 10.0, 0.80), (0.60, 2.0, 0.80)])
    # Within 0.05 of the best model: the fast, inaccurate point is infeasible.
    points = study_points(study, Constraints(max_accuracy_drop=0.05))
    assert [p.feasible for p in points] == [True, False]
    progress = convergence(
        study, OmegaConf.create({"val_accuracy": 0.0, "latency_ms_p50": 30.0}), points
    )
    assert progress.hypervolume == pytest.approx((30.0 - 10.0) * 0.80)
    assert progress.metrics() == {
        "hypervolume": pytest.approx(16.0),
        "pareto_points": 1.0,
        "search_seconds": 0.0,  # no start given
    }


class _Clock(datetime):
    """`datetime` whose `now()` is a fixed moment."""

    @classmethod
    def now(cls, tz=None):
        return cls(2024, 5, 1, 12, 1, 30)


def test_search_seconds_count_from_the_first_trial_s_start(monkeypatch):
    # The module by its name: `tuner.front.convergence` is also the function it exports.
    monkeypatch.setattr(sys.modules["tuner.front.convergence"], "datetime", _Clock)
    study = _study([(0.80, 10.0, 0.80)])
    started = datetime(2024, 5, 1, 11, 59, 0)  # 2 min 30 s before the clock's now
    progress = convergence(study, FIXED_LATENCY, study_points(study), started)
    assert progress.search_seconds == 150.0
    assert progress.metrics()["search_seconds"] == 150.0


def test_no_points_no_reference():
    study = _study([])
    assert convergence(study, FIXED_LATENCY, []) is None
    assert REFERENCE_ATTR not in study.user_attrs


def test_hypervolume_falls_when_a_better_model_makes_points_infeasible():
    reference = OmegaConf.create({"val_accuracy": 0.0, "latency_ms_p50": 30.0})
    constraints = Constraints(max_accuracy_drop=0.03)
    study = _study([(0.80, 10.0, 0.80), (0.78, 4.0, 0.80)])
    first = convergence(study, reference, study_points(study, constraints))
    # Both feasible (0.78 is 2 points below 0.80): 0.80 x (30 - 10) + 0.78 x (10 - 4).
    assert first.hypervolume == pytest.approx(16.0 + 4.68)
    # A model at 0.85 raises the baseline: 0.82 is now the least accuracy that counts, so only
    # its own point is left, and the hypervolume is 0.85 x (30 - 25).
    study.add_trial(
        optuna.trial.create_trial(values=[0.85, 25.0], user_attrs={"reference_accuracy": 0.85})
    )
    later = convergence(study, reference, study_points(study, constraints))
    assert later.hypervolume == pytest.approx(4.25)
    assert later.front_size == 1


def test_a_configured_reference_never_replaces_the_stored_one():
    study = _study([(0.8, 10.0, 0.8)])
    convergence(study, FIXED_LATENCY, study_points(study))
    # A command line may give another one: the study's settings refuse it at start-up
    # (`tuner.store.settings`), and the stored reference is what the curve is computed against.
    other = OmegaConf.create({"val_accuracy": 0.3, "latency_ms_p50": 99.0})
    assert convergence(study, other, study_points(study)).reference == (0.5, 20.0)
