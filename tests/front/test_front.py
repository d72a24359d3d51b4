from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from tuner.front.constraints import Baseline, Constraints, baseline_of
from tuner.front.plots import plot_front_html, plot_front_png
from tuner.front.points import Failures, front_table, study_points

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
    baseline = Baseline(0.84, 2)
    assert constraints.values(0.835, 7.0, baseline) == pytest.approx(
        {"accuracy_drop": -0.005, "latency_budget": -1.0}
    )
    assert not constraints.feasible(0.82, 7.0, baseline)
    assert Constraints().values(0.1, 99.0, baseline) == {}


def test_a_point_exactly_at_the_accuracy_drop_limit_is_within_it():
    # 86 and 85 of 100 validation examples: in floats 0.86 - 0.85 - 0.01 is 8.7e-18, not 0.
    study = _study([("eager", 0.86, 20.0, 0.86), ("int8_dynamic", 0.85, 5.0, 0.86)])
    study.add_trial(
        optuna.trial.create_trial(
            params={"deploy.backend": "int8_dynamic"},
            distributions=BACKEND,
            values=[0.84, 4.0],
            user_attrs={"deploy.backend": "int8_dynamic", "reference_accuracy": 0.86},
        )
    )
    constraints = Constraints(max_accuracy_drop=0.01)
    assert constraints.values(0.85, 5.0, Baseline(0.86, 0)) == {"accuracy_drop": 0.0}
    points = study_points(study, constraints)
    assert [p.feasible for p in points] == [True, True, False]
    assert [p.pareto for p in points] == [True, True, False]


def test_a_study_whose_points_are_all_over_its_constraints_says_so(capsys):
    from tuner.front.messages import front_summary

    constraints = Constraints(latency_budget_ms=4.0)
    study = _study(POINTS)
    points = study_points(study, constraints)
    front_summary("s", points, Failures(), baseline_of(study.trials), constraints)
    out = " ".join(capsys.readouterr().out.split())
    assert "None of the 4 point(s) of study 's' is within its constraints" in out
    assert "(study.latency_budget_ms=4): its front is empty" in out
    both = Constraints(max_accuracy_drop=0.0, latency_budget_ms=4.0)
    front_summary("s", study_points(study, both), Failures(), baseline_of(study.trials), both)
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "(study.max_accuracy_drop=0, study.latency_budget_ms=4; accuracy drops are measured "
        "from the best eager fp32 validation accuracy, 0.8400 (model of trial #2))" in out
    )
    front_summary("s", [], Failures(), Baseline(), constraints)
    assert "Study 's' has no complete trial yet." in capsys.readouterr().out


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
    pixels = _pixels(tmp_path / "front.png")
    # 8 x 5 inches at 120 dpi.
    assert pixels.shape[:2] == (600, 960)
    # tab10's first two colours, by backend name: eager blue, int8_dynamic orange. The legend
    # (lower right) shows both; the front points, drawn at full strength, show them elsewhere:
    # #3 (6 ms, the fastest) in the left third, #2 (0.84, the most accurate) in the top quarter.
    eager, int8 = _where(pixels, "#1f77b4"), _where(pixels, "#ff7f0e")
    assert (int8[1] < 960 // 3).any() and not (eager[1] < 960 // 3).any()
    assert (eager[0] < 600 // 4).any() and not (int8[0] < 600 // 4).any()


def _pixels(path: Path) -> np.ndarray:
    """A PNG's pixels as 0-255 RGB values, rows first."""
    return (matplotlib.image.imread(path)[..., :3] * 255).round().astype(int)


def _where(pixels: np.ndarray, colour: str) -> tuple[np.ndarray, np.ndarray]:
    """The rows and columns of the pixels of exactly `colour` (`#rrggbb`)."""
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    return np.nonzero((pixels == rgb).all(axis=-1))


def _figure(page: str) -> tuple[list[dict], dict]:
    """The traces and layout a plotly page draws, read from its `Plotly.newPlot` call."""
    call = page.index("Plotly.newPlot(")
    decoder = json.JSONDecoder()
    traces, end = decoder.raw_decode(page, page.index("[", call))
    layout, _ = decoder.raw_decode(page, page.index("{", end))
    return traces, layout


def test_interactive_plot_shows_every_point_with_its_status(tmp_path):
    points = study_points(_study(POINTS), Constraints(max_accuracy_drop=0.035))
    plot_front_html(points, "front", tmp_path / "front.html")
    page = (tmp_path / "front.html").read_text()
    # Self-contained: plotly.js is inlined, nothing is fetched from a CDN.
    assert '<script src="http' not in page and "Plotly.newPlot" in page
    traces, layout = _figure(page)
    # Per backend a legend entry and its points; then the front's staircase.
    assert [(t["name"], t["mode"]) for t in traces] == [
        ("eager", "markers"),
        ("eager", "markers"),
        ("int8_dynamic", "markers"),
        ("int8_dynamic", "markers"),
        ("Pareto front", "lines"),
    ]
    legend_eager, eager, legend_int8, int8, front = traces
    assert legend_eager["marker"]["color"] == eager["marker"]["color"] == "#1f77b4"
    assert legend_int8["marker"]["color"] == int8["marker"]["color"] == "#ff7f0e"
    # Each point where POINTS puts it: eager #0 and #2, int8_dynamic #1 and #3.
    assert (eager["x"], eager["y"]) == ([20.0, 22.0], [0.80, 0.84])
    assert (int8["x"], int8["y"]) == ([5.0, 6.0], [0.79, 0.81])
    # Within 0.035 of 0.84, #0 and #1 are infeasible: faded crosses; #2 and #3 the front.
    for trace in (eager, int8):
        assert trace["marker"]["symbol"] == ["x", "circle"]
        assert trace["marker"]["opacity"] == [0.3, 1.0]
    hover = [line.split("<br>") for line in eager["hovertext"] + int8["hovertext"]]
    assert [lines[:4] for lines in hover] == [
        ["trial 0 (infeasible)", "backend eager", "val_accuracy 0.8000", _latency(20.0)],
        ["trial 2 (pareto)", "backend eager", "val_accuracy 0.8400", _latency(22.0)],
        ["trial 1 (infeasible)", "backend int8_dynamic", "val_accuracy 0.7900", _latency(5.0)],
        ["trial 3 (pareto)", "backend int8_dynamic", "val_accuracy 0.8100", _latency(6.0)],
    ]
    # The staircase joins the front, fastest first.
    assert (front["x"], front["y"], front["line"]["shape"]) == ([6.0, 22.0], [0.81, 0.84], "hv")
    assert layout["title"]["text"] == "front"
    assert layout["xaxis"]["title"]["text"] == "latency p50 (ms)"


def _latency(p50: float) -> str:
    """A point's hover line for its latency; `_study` makes p95 1.2 times p50."""
    return f"latency p50 {p50:.2f} ms, p95 {1.2 * p50:.2f} ms"


def test_empty_study_has_an_empty_front(tmp_path):
    points = study_points(_study([]))
    assert points == [] and front_table(points).empty
    plot_front_png(points, "front", tmp_path / "front.png")
    plot_front_html(points, "front", tmp_path / "front.html")
    # Axes and title on a page of the same size, and no point of any backend's colour.
    pixels = _pixels(tmp_path / "front.png")
    assert pixels.shape[:2] == (600, 960) and (pixels != 255).any()
    assert all(_where(pixels, colour)[0].size == 0 for colour in ("#1f77b4", "#ff7f0e"))
    traces, layout = _figure((tmp_path / "front.html").read_text())
    assert [(t["name"], t["x"], t["y"]) for t in traces] == [("Pareto front", [], [])]
    assert layout["title"]["text"] == "front"


def test_front_is_read_against_the_eager_point_of_the_baseline_model():
    from tuner.front.messages import eager_point_of

    study = _study([*POINTS, ("eager", 0.84, 21.0, 0.84)])
    baseline = baseline_of(study.trials)
    # Models #2 and #4 are equally accurate: the earlier one is the baseline.
    assert baseline == Baseline(0.84, 2)
    points = study_points(study)
    assert eager_point_of(points, baseline).trial_number == 2
    assert eager_point_of([p for p in points if p.backend != "eager"], baseline) is None


def test_the_baseline_counts_complete_points_only_and_the_model_being_deployed():
    study = _study(POINTS)  # best complete model: 0.84
    for state, accuracy in ((TrialState.RUNNING, 0.90), (TrialState.FAIL, 0.95)):
        study.add_trial(
            optuna.trial.create_trial(state=state, user_attrs={"reference_accuracy": accuracy})
        )
    assert baseline_of(study.trials) == Baseline(0.84, 2)
    # The model just trained counts before its points are complete...
    assert baseline_of(study.trials, Baseline(0.86, 7)) == Baseline(0.86, 7)
    # ...and one below the best changes nothing.
    assert baseline_of(study.trials, Baseline(0.83, 7)) == Baseline(0.84, 2)
    # The front uses the same baseline: 0.81 is 3 points below 0.84, so within 0.035.
    points = study_points(study, Constraints(max_accuracy_drop=0.035))
    assert [p.trial_number for p in points if p.feasible] == [2, 3]


def test_failed_points_and_failed_trials_are_counted_apart():
    from tuner.front.points import failures_of
    from tuner.keys import FAILED_BACKEND_ATTR

    study = _study(POINTS)
    failed = [
        {FAILED_BACKEND_ATTR: "bf16", "fail_reason": "backend bf16: no native bf16"},
        {"fail_reason": "RuntimeError: loss is NaN"},
        {"fail_reason": "interrupted"},  # queued again below: neither
    ]
    for user_attrs in failed:
        study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, user_attrs=user_attrs))
    study.add_trial(
        optuna.trial.create_trial(state=TrialState.WAITING, system_attrs={"retry_history": [6]})
    )
    # A duplicate teacher trial whose worker died while it was being finished: never a failure.
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.FAIL, system_attrs={"tuner:teacher_duplicate": True}
        )
    )
    assert failures_of(study.trials) == Failures(points=1, trials=1)
