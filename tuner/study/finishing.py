"""The end of a study's run: the front's latencies confirmed and published again where they
moved, every point's run brought to the latency table, and the front summarised with how to
review it."""

from __future__ import annotations

from collections.abc import Callable

import optuna
from omegaconf import DictConfig
from optuna.trial import TrialState

from tuner.front import Constraints, Point, summarise_front
from tuner.interrupts import immediate
from tuner.keys import LATENCY_KEY_ATTR
from tuner.latency import LatencyProtocol, objective_name
from tuner.store import LatencyTable, Leases
from tuner.study import messages
from tuner.study.confirmation import Rebuilder, confirm_front
from tuner.tracking import Tracker


def finish_front(
    study: optuna.Study,
    leases: Leases,
    rebuilder: Rebuilder,
    protocol: LatencyProtocol,
    constraints: Constraints,
    record_front: Callable[[optuna.Study], None],
    tracker: Tracker,
    confirm: bool = True,
) -> bool:
    """The end of a run: the front's latencies confirmed (`tuner.study.confirmation`; not where
    `confirm` is false: a study aimed at another machine, whose measuring worker confirms
    them there), the front published again if they changed (returns whether they did), and
    every point's run brought to the table. The trials are all recorded by now, so a failure
    here is said and leaves the latencies as they were."""
    confirmations = []
    try:
        # One worker at a time: workers ending together would time the front under each
        # other's load, and each add a session.
        with immediate(), leases.hold("front"):
            if confirm:
                confirmations = confirm_front(study, rebuilder, protocol, constraints)
        if confirmations:
            record_front(study)
        _revise_point_latencies(tracker, study)
    except Exception as exc:
        messages.front_not_confirmed(f"{type(exc).__name__}: {exc}")
    return bool(confirmations)


def _revise_point_latencies(tracker: Tracker, study: optuna.Study) -> None:
    """Bring every point's MLflow latency metrics to its key's latency as the table now holds
    it (with the rounds later trials and the front's confirmation added)."""
    table = LatencyTable.of_attrs(study.user_attrs)
    latencies = {
        trial.number: latency
        for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        for latency in [table.result(trial.user_attrs.get(LATENCY_KEY_ATTR))]
        if latency is not None
    }
    tracker.revise_latencies(study.study_name, latencies)


def summarised(
    study: optuna.Study,
    constraints: Constraints,
    cfg: DictConfig,
    tracker: Tracker,
    parent_id: str | None,
    protocol: LatencyProtocol,
) -> list[Point]:
    """The study's points, front flagged, after the front's table and the line that says how
    to review the study (in the parent run `parent_id`, where this run started one)."""
    points = summarise_front(study, constraints)
    messages.review_hint(
        str(cfg.tracking.uri), tracker.experiment_id, parent_id, objective_name(protocol.statistic)
    )
    return points
