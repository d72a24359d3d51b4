"""What the study says on the terminal: the budget, other workers, the teacher, the front's
confirmation and how to review the study."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.console import console
from tuner.secrets import mask_url

if TYPE_CHECKING:
    from tuner.store import Machine


def confirming_front(keys: int, sessions: int) -> None:
    console.print(
        f"Confirming the front: {keys} latenc{'y' if keys == 1 else 'ies'} on it rest on fewer "
        f"than {sessions} measurement sessions of steady rounds "
        "(deploy.latency.front_sessions); timing "
        f"{'it' if keys == 1 else 'them'} again, interleaved"
    )


def waited_for_steady(waited_s: float | None, timeout_s: float) -> None:
    """Said only where the confirmation had to wait for a slow spell to pass."""
    if waited_s is None:
        console.print(
            f"  [yellow]the machine reference read no steady stretch in {timeout_s:.0f} s; "
            "timing again in the spell[/]"
        )
    elif waited_s >= 1.0:
        console.print(f"  [dim]waited {waited_s:.0f} s for a slow spell to pass[/]")


def short_of_steady_sessions(label: str, counted: int, sessions: int) -> None:
    """A front key the confirmation timed as often as it may, still short of sessions of steady
    rounds (`LatencyTable.counted_session_count`)."""
    pooled = "those" if counted else "all of them, the steadiest rounds of each"
    console.print(
        f"  [yellow]{label}: {counted} of its {sessions} sessions have steady rounds; its "
        f"latency pools {pooled}; run the study again later to confirm it[/]"
    )


def front_not_confirmed(reason: str) -> None:
    console.print(
        f"[yellow]The front's latencies could not be confirmed ({reason}); they stay as measured[/]"
    )


def not_confirmed(label: str, reason: str) -> None:
    console.print(f"  [yellow]{label} not timed again ({reason}); it keeps its latency[/]")


def stale_trial(trial_number: int, reason: str) -> None:
    console.print(f"  [yellow]trial #{trial_number} failed: {reason}[/]")


def budget_reached(study_name: str, n_trials: int) -> None:
    console.print(
        f"Study '{study_name}' has its {n_trials} trained configurations (study.n_trials); "
        "raise study.n_trials to add more."
    )


def confirming_finished_front(study_name: str, n_trials: int) -> None:
    console.print(
        f"Study '{study_name}' has its {n_trials} trained configurations (study.n_trials); "
        "this run confirms its front, some of whose latencies rest on too few sessions "
        "(deploy.latency.front_sessions)"
    )


def waiting_for_workers(running: int) -> None:
    console.print(
        f"The study has its configurations; waiting for {running} trial(s) running in other "
        "workers (one whose worker dies is queued again and taken here)."
    )


def training_teacher(trial_number: int, reference: object) -> None:
    console.print(
        f"Training the distillation teacher (train.distill.teacher={reference}) in trial "
        f"#{trial_number}, before any student; it is stored with the study for every worker."
    )


def waiting_for_teacher(trial_number: int) -> None:
    console.print(
        f"Waiting for the distillation teacher, trained by another worker in trial "
        f"#{trial_number} (one whose worker dies is queued again and taken here)."
    )


def unknown_cpu(notice: str) -> None:
    console.print(f"[yellow]Notice:[/] {notice}")


def backend_left_out(backend: str, reason: str) -> None:
    console.print(f"[yellow]Backend {backend} is left out on this machine:[/] {reason}")


def review_hint(
    tracking_uri: str, experiment_id: str, parent_run_id: str | None, objective: str
) -> None:
    """How to look at the study in the MLflow UI: the command, and the addresses of the
    experiment's runs (with the latency `objective`'s column to add) and of the run holding the
    front (the UI opens an experiment on its GenAI overview otherwise)."""
    # Logs are read by others: a password in the URI is not printed.
    tracking_uri = mask_url(tracking_uri)
    served = tracking_uri.startswith(("http://", "https://"))
    base = tracking_uri.rstrip("/") if served else "http://127.0.0.1:5000"
    runs = f"{base}/#/experiments/{experiment_id}/runs"
    if not served:
        console.print(f"Review it: mlflow ui --backend-store-uri {tracking_uri}")
    console.print(f"  runs (add val_accuracy, {objective} and the pareto tag as columns): {runs}")
    if parent_run_id:
        console.print(f"  the front (Artifacts, pareto/front.html): {runs}/{parent_run_id}")


def machine(recorded: tuple[Machine, Machine | None]) -> None:
    """The name this machine's latencies are filed under, what it is, and what an earlier
    record under the same name said where that differs."""
    now, earlier = recorded
    console.print(f"Machine: {now.name} ({now.describe()}; deploy.machine)")
    if earlier is not None:
        console.print(
            f"  [yellow]machine '{now.name}' was recorded as {earlier.describe()} at "
            f"{earlier.at}, with other protocol or library versions: its latencies measured "
            "then are kept, and this machine's are measured anew[/]"
        )
