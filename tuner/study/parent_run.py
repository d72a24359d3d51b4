"""This worker's MLflow parent run of the study: started with the study's settings, the latency
protocol and the machine's peaks, and the front published on it after every trial with its
convergence curves."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import optuna
from omegaconf import DictConfig

from tuner import console
from tuner.front import Constraints, convergence, front_note, front_of
from tuner.insight import MachinePeak
from tuner.latency import study_peak
from tuner.secrets import masked_yaml
from tuner.store import budget
from tuner.study.backends import described
from tuner.study.preparation import Ready
from tuner.tracking import Tracker


def machine_peak(
    study: optuna.Study, protocol_record: Mapping[str, Any], threads: int
) -> MachinePeak | None:
    """This machine's peaks for the points' rooflines (`tuner.insight.roofline`); None, said
    once, where they cannot be measured: the points go on without their roofline."""
    try:
        return study_peak(study, protocol_record, threads)
    except Exception as exc:
        console.console.print(
            f"[yellow]The machine's peaks could not be measured ({type(exc).__name__}: {exc}); "
            "points are recorded without their roofline.[/]"
        )
        return None


def start_parent_run(
    ready: Ready, protocol_record: Mapping[str, Any], peak: MachinePeak | None
) -> str:
    """The parent run's id, its params the study's settings, backends and measuring setup."""
    cfg, constraints = ready.cfg, ready.constraints
    return ready.tracker.start_parent(
        ready.study.study_name,
        {
            "study.n_trials": cfg.study.n_trials,
            "study.sampler": cfg.study.sampler,
            "search_space": ", ".join(ready.space.keys),
            "deploy.backends": ", ".join(ready.backends),
            **({"deploy.left_out": described(ready.left_out)} if ready.left_out else {}),
            "study.max_accuracy_drop": constraints.max_accuracy_drop,
            "study.latency_budget_ms": constraints.latency_budget_ms,
            **protocol_record,
            **({} if peak is None else peak.record(prefix="machine_peak.")),
        },
        masked_yaml(cfg),
    )


def front_recorder(
    tracker: Tracker,
    parent_id: str,
    constraints: Constraints,
    hypervolume_reference: DictConfig,
    protocol_record: Mapping[str, Any],
) -> Callable[[optuna.Study], None]:
    """What publishes the study's front on the parent run: its points with a note, and the
    hypervolume curve by configurations trained and by seconds of search."""

    def record_front(study: optuna.Study) -> None:
        trials = study.get_trials(deepcopy=False)
        points, baseline, split = front_of(trials, study.user_attrs, constraints)
        started = min((t.datetime_start for t in trials if t.datetime_start), default=None)
        progress = convergence(study, hypervolume_reference, points, started)
        note = front_note(study.study_name, points, progress, protocol_record, baseline)
        note += f"\n\n{split.note()}" if split.note() else ""
        tracker.publish_front(parent_id, study.study_name, points, note)
        if progress is not None:
            # Stepped by the configurations whose points are in: other workers' running ones
            # are not yet.
            finished = budget.trained([t for t in trials if t.state.is_finished()])
            tracker.log_metrics(parent_id, progress.metrics(), step=finished)
            # The same curve against wall-clock seconds of search: front quality over time.
            tracker.log_metrics(
                parent_id,
                {"hypervolume_by_second": progress.hypervolume},
                step=int(progress.search_seconds),
            )

    return record_front
