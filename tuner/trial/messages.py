"""What a trial says on the terminal: its header, each backend's result, its teacher."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tuner.console import console, short
from tuner.errors import StudyStopped, TrialFailed
from tuner.secrets import mask_urls_in

if TYPE_CHECKING:
    from tuner.deploy import BackendResult
    from tuner.latency import LatencyResult


def trial_header(index: int, total: int, trial_number: int, params: Mapping[str, Any]) -> None:
    described = ", ".join(f"{key}={short(value)}" for key, value in params.items())
    console.print(f"[bold]Trial {index}/{total}[/] (#{trial_number}) {described}")


def backend_result(result: BackendResult) -> None:
    from tuner.deploy import BACKENDS

    # One column for every registered backend name, so results line up.
    width = max(len(name) for name in BACKENDS.names())
    if result.error:
        console.print(f"  {result.backend:<{width}} [red]failed:[/] {result.error}")
        return
    assert result.latency is not None
    console.print(
        f"  {result.backend:<{width}} val_accuracy {result.val_accuracy:.4f} "
        f"(agrees {result.agreement:.1%})  latency p50 {result.latency.p50_ms:6.2f} ms "
        f"(p95 {result.latency.p95_ms:.2f}, {result.latency.rounds} rounds "
        f"±{result.latency.spread_pct:.0f}%)  size {result.model_size_mb:.1f} MB  "
        f"convert {result.convert_seconds:.1f} s"
    )
    if result.notes.get("attention_fused") is False:
        console.print(
            f"  [yellow]{result.backend}: attention did not fuse[/] (softmax nodes are left in "
            "its graph; tag deploy.attention_fused=false)"
        )


def latencies_before_training(
    results: Mapping[str, LatencyResult | None], measured: list[str], statistic: str
) -> None:
    """One line: this architecture's latency on each backend by the study's `statistic`, and
    which were measured now (on the untrained model) rather than taken from the study's latency
    table."""
    shown = []
    for backend, result in results.items():
        if result is None:
            shown.append(f"{backend} ?")
            continue
        source = "" if backend in measured else " (table)"
        shown.append(
            f"{backend} {result.ranked_ms(statistic):.2f} ms ±{result.spread_pct:.0f}%{source}"
        )
    console.print(f"  latency before training ({statistic}): " + ", ".join(shown))


def untimed_before_training(backend: str, reason: str) -> None:
    console.print(
        f"  [yellow]{backend} did not convert the untrained model ({reason}); it is timed "
        "after training[/]"
    )


def interleaved_timing_failed(reason: str) -> None:
    console.print(
        f"  [yellow]timing the backends in turn failed ({reason}); each is timed on its own[/]"
    )


def trial_pruned(trial_number: int, reason: str) -> None:
    console.print(f"  [yellow]trial #{trial_number} pruned:[/] {reason}")


def trial_failed(trial_number: int, reason: str, error: BaseException) -> None:
    console.print(f"  [red]trial #{trial_number} failed:[/] {mask_urls_in(reason)}")
    if not isinstance(error, (TrialFailed, StudyStopped)):
        # Unexpected: keep the traceback, which Optuna's own report of it would have shown.
        print(mask_urls_in("".join(traceback.format_exception(error))), file=sys.stderr)


def trial_lost_database(trial_number: int, reason: str) -> None:
    console.print(f"  [yellow]trial #{trial_number} stopped:[/] {mask_urls_in(reason)}")


def teacher_loaded(trained_in: int, location: str) -> None:
    console.print(
        f"Loading the distillation teacher that trial #{trained_in} trained and stored "
        f"({location}) instead of training another; this retry deploys the backends that have "
        "no point of it yet."
    )


def teacher_missing(location: str, reason: str) -> None:
    console.print(
        f"[yellow]Notice:[/] the study's stored teacher at {location} cannot be loaded "
        f"({reason}); it is trained again, once."
    )


def model_not_logged(backend: str, reason: str) -> None:
    console.print(f"  [yellow]{backend}: point kept, but its model was not logged:[/] {reason}")


def waiting_for_target(machine: str, what: str, seconds_left: float) -> None:
    """A trial of a study aimed at another machine waits for that machine's worker."""
    console.print(
        f"  waiting for machine '{machine}' (study.target_machine) {what}, at most "
        f"{max(0.0, seconds_left):.0f} s more"
    )
