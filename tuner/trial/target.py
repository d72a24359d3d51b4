"""A study aimed at the machine that will serve (`study.target_machine`): a trial's latencies are
that machine's, timed there by a measuring worker (`python -m tuner.measure`), never here.

Its latency keys are this machine's keys under the target's protocol record (`key_on`), as the
target's measuring worker recorded it in the study. They are written on the trial before it
trains, and the trial waits for the target's latencies at most `study.target_wait_s` seconds
from its start; past that the study stops, saying that no measuring worker for the target is
running and the command that starts one.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import optuna

from tuner.errors import StudyStopped
from tuner.keys import LATENCY_KEYS_ATTR
from tuner.latency import LatencyResult
from tuner.secrets import mask_urls_in
from tuner.store import LatencyTable, digest_of, key_on, machines_in, register_keys
from tuner.trial import messages
from tuner.trial.context import TrialContext

# Seconds between two reads of the study while waiting for the target's latencies.
_POLL_S = 1.0
# Keys of the training command that the measuring worker's command leaves out or sets itself.
_NOT_FOR_MEASURING = re.compile(
    r"^\+*(study\.target_machine|study\.target_wait_s|deploy\.machine)="
)

Keys = Mapping[str, dict[str, Any] | None]


class TargetNotMeasured(StudyStopped):
    """No measuring worker gave the target machine's latencies in time."""


def announced(
    ctx: TrialContext, trial: optuna.Trial, keys: Keys, deadline: float
) -> dict[str, dict[str, Any] | None]:
    """The trial's latency keys where its latencies are measured (the target's, under
    `study.target_machine`; else this machine's), written on the trial and in the study for
    measuring workers to find. Waits for the target's record until `deadline`."""
    if ctx.target_machine is not None:
        record = _waited_for(ctx, deadline, lambda: _record_of(ctx), "to be recorded")
        keys = {b: None if k is None else key_on(k, record) for b, k in keys.items()}
    register_keys(ctx.storage, ctx.study_id, [k for k in keys.values() if k is not None])
    trial.set_user_attr(LATENCY_KEYS_ATTR, {b: k and digest_of(k) for b, k in keys.items()})
    return dict(keys)


def target_latencies(
    ctx: TrialContext, keys: Keys, deadline: float
) -> dict[str, LatencyResult | None]:
    """Each backend's latency on the target machine, waited for until `deadline` (past it, the
    study stops: `TargetNotMeasured`). None for a backend without a key, or one the target's
    measuring worker could not time (`why_not_measured` says why)."""

    def settled() -> dict[str, LatencyResult | None] | None:
        table = ctx.latency_table()
        found = {b: known_latency(table, k) for b, k in keys.items()}
        missing = [
            b
            for b, k in keys.items()
            if k is not None and found[b] is None and digest_of(k) not in table.given_up
        ]
        return None if missing else found

    waiting = ", ".join(b for b, k in keys.items() if k is not None)
    return _waited_for(ctx, deadline, settled, f"to time {waiting}")


def why_not_measured(ctx: TrialContext, key: Mapping[str, Any] | None) -> str:
    """Why a backend has no latency on the target machine."""
    if key is None:
        return (
            "its graph follows the trained weights, so no measuring worker can time it before "
            f"training; it has no latency on machine '{ctx.target_machine}'"
        )
    reason = ctx.latency_table().given_up.get(digest_of(key))
    return f"machine '{ctx.target_machine}' cannot time it: {reason or 'not measured there'}"


def _record_of(ctx: TrialContext) -> dict[str, Any] | None:
    attrs = ctx.storage.get_study_user_attrs(ctx.study_id)
    machine = machines_in(attrs).get(str(ctx.target_machine))
    return None if machine is None else machine.record


def _waited_for(ctx: TrialContext, deadline: float, found: Callable[[], Any], what: str) -> Any:
    """`found()` once it is not None, read every `_POLL_S` seconds until `deadline`."""
    value = found()
    if value is not None:
        return value
    messages.waiting_for_target(str(ctx.target_machine), what, deadline - time.monotonic())
    while time.monotonic() < deadline:
        time.sleep(_POLL_S)
        value = found()
        if value is not None:
            return value
    raise TargetNotMeasured(not_measured_message(ctx, what))


def not_measured_message(ctx: TrialContext, what: str) -> str:
    target = ctx.target_machine
    overrides = [o for o in ctx.serving.overrides if not _NOT_FOR_MEASURING.match(o)]
    command = " ".join(["python -m tuner.measure", *overrides, f"deploy.machine={target}"])
    return mask_urls_in(
        f"no measuring worker for machine '{target}' (study.target_machine) is running: this "
        f"trial waited study.target_wait_s={float(ctx.cfg.study.target_wait_s):g} s for it "
        f"{what}. Start one on that machine: {command} --follow"
    )


def known_latency(table: LatencyTable, key: Mapping[str, Any] | None) -> LatencyResult | None:
    """A key's latency as the table has it (None: not measured, or no key)."""
    return None if key is None else table.result(digest_of(key))
