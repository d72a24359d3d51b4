from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from tuner.constraints import Constraints
from tuner.front import front_table, study_points
from tuner.front_plots import plot_front_html, plot_front_png

BACKEND = {"deploy.backend": CategoricalDistribution(("eager", "int8_dynamic"))}


def _study(points: list[tuple[str, float, float, float]]) -> optuna.Study:
    """Points as (backend, val_accuracy, latency, eager accuracy of the trained model)."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    for number, (backend, acc, latency, reference) in enumerate(points):
        study.add_trial(
            optuna.trial.create_trial(
                params={"deploy.backend": backend},
                distributions=BACKEND,
                values=[acc, latency],
                user_attrs={
                    "deploy.backend": backend,
                    "reference_accuracy": reference,
                    "trained_in_trial": number - number % 2,
                    "latency_ms_p95": latency * 1.2,
                    "model_size_mb": 10.0,
                },
            )
        )
    return study


POINTS = [
    ("eager", 0.80, 20.0, 0.80),  # 0
    ("int8_dynamic", 0.79, 5.0, 0.80),  # 1
    ("eager", 0.84, 22.0, 0.84),  # 2: the best fp32 model
    ("int8_dynamic", 0.81, 6.0, 0.84),  # 3
]


def test_front_without_constraints():
    points = study_points(_study(POINTS))
    assert [p.pareto for p in points] == [False, True, True, True]
    assert all(p.feasible for p in points)
    assert [p.trained_in_trial for p in points] == [0, 0, 2, 2]


def test_accuracy_drop_is_measured_from_the_best_model_of_the_whole_study():
    # Within 0.035 of 0.84: point 1 (0.79) was fine next to its own model (0.80), not any more.
    points = study_points(_study(POINTS), Constraints(max_accuracy_drop=0.035))
    assert [p.feasible for p in points] == [False, False, True, True]
    assert [p.pareto for p in points] == [False, False, True, True]


def test_latency_budget():
    points = study_points(_study(POINTS), Constraints(latency_budget_ms=10.0))
    assert [p.feasible for p in points] == [False, True, False, True]
    # The most accurate point (2) is over budget, so the fast ones make the front.
    assert [p.pareto for p in points] == [False, True, False, True]


def test_constraint_values_follow_optunas_sign_convention():
    constraints = Constraints(max_accuracy_drop=0.01, latency_budget_ms=8.0)
    assert constraints.values(0.835, 7.0, 0.84) == pytest.approx([-0.005, -1.0])
    assert not constraints.feasible(0.82, 7.0, 0.84)
    assert not Constraints().active and Constraints().values(0.1, 99.0, 0.9) == []


def test_table_and_plot(tmp_path):
    points = study_points(_study(POINTS), Constraints(max_accuracy_drop=0.035))
    table = front_table(points)
    assert table["trial"].tolist() == [3, 2]  # fastest first
    assert table["backend"].tolist() == ["int8_dynamic", "eager"]
    assert table.columns[:7].tolist() == [
        "trial",
        "backend",
        "val_accuracy",
        "latency_ms_p50",
        "latency_ms_p95",
        "model_size_mb",
        "trained_in_trial",
    ]
    plot_front_png(points, "front", tmp_path / "front.png")
    assert (tmp_path / "front.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_interactive_plot_shows_every_point_with_its_status(tmp_path):
    points = study_points(_study(POINTS), Constraints(max_accuracy_drop=0.035))
    plot_front_html(points, "front", tmp_path / "front.html")
    page = (tmp_path / "front.html").read_text()
    # Self-contained: plotly.js is inlined, nothing is fetched from a CDN.
    assert '<script src="http' not in page and "Plotly.newPlot" in page
    for number, status in enumerate(["infeasible", "infeasible", "pareto", "pareto"]):
        assert f"trial {number} ({status})" in page
    assert '"name":"eager"' in page and '"name":"int8_dynamic"' in page
    assert '"name":"Pareto front"' in page


def test_empty_study_has_an_empty_front(tmp_path):
    points = study_points(_study([]))
    assert points == [] and front_table(points).empty
    plot_front_png(points, "front", tmp_path / "front.png")
    plot_front_html(points, "front", tmp_path / "front.html")


def test_front_is_read_against_the_most_accurate_eager_point():
    from tuner.console import most_accurate_eager

    points = study_points(_study([*POINTS, ("eager", 0.84, 21.0, 0.84)]))
    assert most_accurate_eager(points).trial_number == 4  # as accurate as #2, and faster
    assert most_accurate_eager([p for p in points if p.backend != "eager"]) is None
