"""A study's points and their Pareto front: constraints, convergence, early stopping,
recommendation, plots."""

from __future__ import annotations

from tuner.front.compare import biggest_difference, breakdown
from tuner.front.constraints import Baseline, Constraints, baseline_of
from tuner.front.convergence import convergence, front_note, reference_point
from tuner.front.current import front_of, summarise_front
from tuner.front.early_stopping import (
    NotWorthTraining,
    PruningSettings,
    over_budget_reason,
    sampler_view,
    stop_reason,
)
from tuner.front.insight_plots import plot_profile_html, plot_profile_png, profiled_front
from tuner.front.messages import eager_point_of
from tuner.front.pareto import hypervolume, pareto_mask
from tuner.front.plots import plot_front_html, plot_front_png
from tuner.front.points import Point, failures_of, front_table, points_of, study_points
from tuner.front.recommend import DEFAULT_MAX_ACCURACY_DROP, Rule, recommend

__all__ = [
    "Baseline",
    "Constraints",
    "DEFAULT_MAX_ACCURACY_DROP",
    "NotWorthTraining",
    "Point",
    "PruningSettings",
    "Rule",
    "baseline_of",
    "biggest_difference",
    "breakdown",
    "convergence",
    "eager_point_of",
    "failures_of",
    "front_note",
    "front_of",
    "front_table",
    "hypervolume",
    "over_budget_reason",
    "pareto_mask",
    "plot_front_html",
    "plot_front_png",
    "plot_profile_html",
    "plot_profile_png",
    "points_of",
    "profiled_front",
    "recommend",
    "reference_point",
    "sampler_view",
    "stop_reason",
    "study_points",
    "summarise_front",
]
